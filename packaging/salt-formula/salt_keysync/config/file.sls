# -*- coding: utf-8 -*-
# vim: ft=sls
#
# /etc/salt-keysync/config.toml from pillar salt_keysync:config, and the TLS
# files from pillar salt_keysync:tls, with the owners and modes the package's
# install script gives them (/usr/lib/salt-keysync/owners): the agent's user
# reads its config and owns its key, only root changes the config and the CA
# it trusts. Nothing here restarts the agent: service/running.sls decides.

{%- set tplroot = tpldir.split('/')[0] %}
{%- set sls_package_install = tplroot ~ '.package.install' %}
{%- from tplroot ~ "/map.jinja" import salt_keysync with context %}
{%- from tplroot ~ "/libconfig.jinja" import config_text with context %}

{#- The pillar first. A salt-master that cannot enter its pillar folder (it
    renders pillar as its own user, `salt` since Salt 3006) gives the minion
    an empty pillar without any error; the PEM checks below would then blame
    the certificates. #}
{%- set minion = grains.get('id', '') %}
{%- set pillar_settings = salt['pillar.get']('salt_keysync', {}) %}
{%- set check_with = "See what the salt-master gives this minion with `salt-call pillar.get salt_keysync:config` on it (masterless: salt-call --local pillar.get salt_keysync:config)" %}
{%- if not pillar_settings %}
{{-   raise("pillar salt_keysync is empty for minion " ~ minion ~ ": the formula writes the agent's config and TLS files from it. " ~ check_with ~ ". Empty there: the pillar top file gives " ~ minion ~ " no salt_keysync file, or the salt-master cannot enter the pillar folder (pillar_roots, /srv/pillar by default): it reads pillar as its user (`user:` in its config, salt by default), so the folder is to be 0750 root:salt and its files 0640 root:salt (/usr/share/doc/salt-keysync/formula.md, Pillar)") }}
{%- endif %}
{%- if not pillar_settings.get('tls') %}
{{-   raise("pillar salt_keysync:tls is missing for minion " ~ minion ~ ", whose pillar salt_keysync has only " ~ (pillar_settings | list | sort | join(", ")) ~ ": the agent's CA, certificate and key come from it. " ~ check_with ~ ". The pillar file holding it is to be in the top file for " ~ minion ~ " and readable by the salt-master's user (/usr/share/doc/salt-keysync/formula.md, Pillar)") }}
{%- endif %}

{#- Each PEM is read here only to say what is missing, never printed. #}
{%- set kinds = {'ca': 'CERTIFICATE', 'cert': 'CERTIFICATE', 'key': 'PRIVATE KEY'} %}
{%- for role in ['ca', 'cert', 'key'] %}
{%-   set pem = salt['pillar.get']('salt_keysync:tls:' ~ role, '') %}
{%-   if pem is not string or ('-----BEGIN ' not in pem) or (kinds[role] ~ '-----') not in pem %}
{{-     raise("salt_keysync:tls:" ~ role ~ " is missing or holds no PEM " ~ kinds[role] ~ " (salt-keysync certs init/issue make them)") }}
{%-   endif %}
{%- endfor %}

include:
  - {{ sls_package_install }}

salt-keysync-config-file-tls-directory:
  file.directory:
    - name: {{ salt_keysync.tls_dir }}
    - user: root
    - group: {{ salt_keysync.group }}
    - mode: '0750'
    - makedirs: True
    - require:
      - sls: {{ sls_package_install }}

{#- The CA decides whom the agent trusts: root's, readable by all like any certificate. #}
{%- for role, owner, group, mode in [
      ('ca', 'root', salt_keysync.rootgroup, '0644'),
      ('cert', 'root', salt_keysync.rootgroup, '0644'),
      ('key', salt_keysync.user, salt_keysync.group, '0600'),
    ] %}

salt-keysync-config-file-tls-{{ role }}:
  file.managed:
    - name: {{ salt_keysync.tls_dir }}/{{ salt_keysync.tls_files[role] }}
    # From pillar at run time: the PEM is never part of the rendered SLS.
    - contents_pillar: salt_keysync:tls:{{ role }}
    - user: {{ owner }}
    - group: {{ group }}
    - mode: '{{ mode }}'
    # Never a diff of a private key in the output, the job cache or a log;
    # nor of certificates, whose diff says nothing.
    - show_changes: False
    - require:
      - file: salt-keysync-config-file-tls-directory
{%- endfor %}

salt-keysync-config-file-file-managed:
  file.managed:
    - name: {{ salt_keysync.config_file }}
    - contents: {{ config_text | json }}
    - user: root
    - group: {{ salt_keysync.group }}
    - mode: '0640'
    - require:
      - sls: {{ sls_package_install }}
