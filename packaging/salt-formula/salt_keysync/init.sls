# -*- coding: utf-8 -*-
# vim: ft=sls
#
# The package, its config and TLS files from pillar, and the running agent
# (checked before every start, restart or reload).

include:
  - .package
  - .config
  - .service
