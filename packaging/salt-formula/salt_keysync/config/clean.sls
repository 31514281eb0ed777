# -*- coding: utf-8 -*-
# vim: ft=sls
#
# Removes what config/file.sls wrote (the config, the TLS folder with the
# node's key) and the record of what the agent was started with, once the
# agent is stopped.

{%- set tplroot = tpldir.split('/')[0] %}
{%- set sls_service_clean = tplroot ~ '.service.clean' %}
{%- from tplroot ~ "/map.jinja" import salt_keysync with context %}

include:
  - {{ sls_service_clean }}

{%- for what, name in [
      ('config', salt_keysync.config_file),
      ('tls-directory', salt_keysync.tls_dir),
      ('applied', salt['config.get']('cachedir') ~ '/' ~ salt_keysync.applied_file),
    ] %}

salt-keysync-config-clean-{{ what }}-file-absent:
  file.absent:
    - name: {{ name }}
    - require:
      - sls: {{ sls_service_clean }}
{%- endfor %}
