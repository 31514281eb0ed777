# -*- coding: utf-8 -*-
# vim: ft=sls

{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import salt_keysync with context %}

salt-keysync-service-clean-service-dead:
  service.dead:
    - name: {{ salt_keysync.service.name }}
    - enable: False
