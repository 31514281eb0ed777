# -*- coding: utf-8 -*-
# vim: ft=sls
#
# Undoes init.sls in reverse: the agent stopped and disabled, the files the
# formula wrote removed, the package removed (not purged: the state in
# /var/lib/salt-keysync and the audit log stay, as with `apt-get remove`).

include:
  - .service.clean
  - .config.clean
  - .package.clean
