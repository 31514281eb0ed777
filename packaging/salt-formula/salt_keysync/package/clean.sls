# -*- coding: utf-8 -*-
# vim: ft=sls
#
# Removes the package after the agent is stopped and the formula's files are
# gone. Not a purge: /var/lib/salt-keysync (the state: a reinstall carries on
# where it stopped) and the audit log stay, as with `apt-get remove`.

{%- set tplroot = tpldir.split('/')[0] %}
{%- set sls_config_clean = tplroot ~ '.config.clean' %}
{%- from tplroot ~ "/map.jinja" import salt_keysync with context %}

include:
  - {{ sls_config_clean }}

salt-keysync-package-clean-pkg-removed:
  pkg.removed:
    - name: {{ salt_keysync.pkg.name }}
    - require:
      - sls: {{ sls_config_clean }}
