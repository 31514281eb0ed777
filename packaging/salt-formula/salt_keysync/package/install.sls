# -*- coding: utf-8 -*-
# vim: ft=sls
#
# salt-keysync from the configured repositories, or from the package file
# pillar names (salt_keysync:pkg:source). The package does not start the
# agent: service/running.sls does, once config and certificates are there.

{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import salt_keysync with context %}
{%- set pkg = salt_keysync.pkg %}
{%- if pkg.source and not (pkg.source | regex_match('^(.*\\.' ~ pkg.format ~ ')$')) %}
{{- raise("salt_keysync:pkg:source " ~ pkg.source ~ " is not a ." ~ pkg.format ~ " file, the package format of os_family " ~ grains.os_family) }}
{%- endif %}

salt-keysync-package-install-pkg-installed:
  pkg.installed:
    - name: {{ pkg.name }}
{%- if pkg.source %}
    - sources:
      - {{ pkg.name }}: {{ pkg.source | json }}
    # A file has nothing to refresh; without this Salt would run
    # `apt-get update` / `dnf makecache` first, which needs the network.
    - refresh: False
{%- elif pkg.version %}
    - version: {{ pkg.version | json }}
{%- endif %}
