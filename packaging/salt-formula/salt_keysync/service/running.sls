# -*- coding: utf-8 -*-
# vim: ft=sls
#
# The agent enabled and running on the config and TLS files config/file.sls
# writes. Which of start, restart, reload or nothing this run needs is
# decided while the SLS renders, before anything changes:
#
#   start    the agent is not running (a first install, a stop, a failure)
#   restart  a key other than [tls] and [[peer]] differs from what the
#            running agent was started with: it refuses to reload those
#   reload   only [tls], [[peer]] or a TLS file's content differ: applied
#            live by `salt-keysync reload` (the unit's ExecReload), no
#            connection to an unchanged peer is dropped
#
# "What the agent was started with" is both the files on disk before this
# run and the record this state keeps under the minion's cachedir (digests
# of what the last successful start, restart or reload used). The files
# alone would not do: when `salt-keysync check` fails, the new files stay
# on disk while the agent runs on the old ones, and the next run, finding
# nothing to write, would otherwise leave it so for good. A missing record
# (cache cleared, first run over an agent installed by hand) means restart.
#
# Every start, restart and reload runs `salt-keysync check` first: a
# failing check (exit status 1, its FAIL lines in the state's output) stops
# this state before the service is touched, and the record keeps the old
# digests, so the next run tries again. A peer that cannot be reached is a
# WARN line and exit status 0: the agent starts and keeps retrying it.

{%- set tplroot = tpldir.split('/')[0] %}
{%- set sls_config_file = tplroot ~ '.config.file' %}
{%- from tplroot ~ "/map.jinja" import salt_keysync with context %}
{%- from tplroot ~ "/libconfig.jinja" import config_text, restart_part, split_line with context %}

{%- set service = salt_keysync.service.name %}
{%- set config_file = salt_keysync.config_file %}
{%- set applied_file = salt['config.get']('cachedir') ~ '/' ~ salt_keysync.applied_file %}

{#- A file as file.managed writes `contents`/`contents_pillar`: every line
    ended by one newline. #}
{%- macro as_written(text) -%}
{{ (text.splitlines() | join('\n')) ~ '\n' }}
{%- endmacro %}
{%- macro disk_sha256(path) -%}
{{ salt['file.get_hash'](path, 'sha256') if salt['file.file_exists'](path) else 'absent' }}
{%- endmacro %}

{#- What this run will write, and what is on disk now. #}
{%- set want_restart = restart_part | sha256 %}
{%- set want_parts = [as_written(config_text) | sha256] %}
{%- set disk_parts = [disk_sha256(config_file)] %}
{%- for role in ['ca', 'cert', 'key'] %}
{%-   do want_parts.append(as_written(salt['pillar.get']('salt_keysync:tls:' ~ role, '')) | sha256) %}
{%-   do disk_parts.append(disk_sha256(salt_keysync.tls_dir ~ '/' ~ salt_keysync.tls_files[role])) %}
{%- endfor %}
{%- set want_all = want_parts | join(' ') | sha256 %}
{%- set disk_config = salt['file.read'](config_file) if salt['file.file_exists'](config_file) else '' %}
{%- set disk_restart_same = disk_config.startswith(restart_part ~ '\n' ~ split_line) %}
{%- set disk_all_same = disk_parts == want_parts %}

{#- What the last start, restart or reload used: "restart HEX" and "all HEX" lines. #}
{%- set applied = {} %}
{%- if salt['file.file_exists'](applied_file) %}
{%-   for line in salt['file.read'](applied_file).splitlines() %}
{%-     set words = line.split() %}
{%-     if words | length == 2 %}
{%-       do applied.update({words[0]: words[1]}) %}
{%-     endif %}
{%-   endfor %}
{%- endif %}

{%- if not salt['service.status'](service) %}
{%-   set action = 'start' %}
{%- elif not disk_restart_same or applied.get('restart') != want_restart %}
{%-   set action = 'restart' %}
{%- elif not disk_all_same or applied.get('all') != want_all %}
{%-   set action = 'reload' %}
{%- else %}
{%-   set action = 'none' %}
{%- endif %}
{%- do salt['log.info']('salt_keysync: the agent needs: ' ~ action) %}

include:
  - {{ sls_config_file }}
{%- if action != 'none' %}

salt-keysync-service-running-cmd-check:
  cmd.run:
    - name: {{ salt_keysync.bin }} check --config {{ config_file }}
    - require:
      - sls: {{ sls_config_file }}
{%- endif %}

# Its own state, not `enable: True` below: a service.running that enables
# reports a change and then skips its watch, so a restart would be lost.
# Not enabled either while the check fails: a reboot would only fail it.
salt-keysync-service-running-service-enabled:
  service.enabled:
    - name: {{ service }}
    - require:
      - sls: {{ sls_config_file }}
{%- if action != 'none' %}
      - cmd: salt-keysync-service-running-cmd-check
{%- endif %}

salt-keysync-service-running-service-running:
  service.running:
    - name: {{ service }}
    - require:
      - sls: {{ sls_config_file }}
      - service: salt-keysync-service-running-service-enabled
{%- if action == 'reload' %}
      - cmd: salt-keysync-service-running-cmd-check
{%- elif action in ['start', 'restart'] %}
    # The check ran (a change): a running agent is restarted (mod_watch), a
    # stopped one started. A failed check fails this state untouched.
    - watch:
      - cmd: salt-keysync-service-running-cmd-check
{%- endif %}

{%- if action == 'reload' %}

# `salt-keysync reload` rather than `systemctl reload`: the same request
# (ExecReload runs it), but its output says what changed, or why the agent
# refused, where systemctl would only point at the journal.
salt-keysync-service-running-cmd-reload:
  cmd.run:
    - name: {{ salt_keysync.bin }} reload --config {{ config_file }}
    - require:
      - service: salt-keysync-service-running-service-running
{%- endif %}

salt-keysync-service-running-file-applied:
  file.managed:
    - name: {{ applied_file }}
    - contents: |
        # salt_keysync formula: sha256 of what the running agent was last started, restarted or reloaded with
        restart {{ want_restart }}
        all {{ want_all }}
    - makedirs: True
    - mode: '0600'
    - require:
      - service: salt-keysync-service-running-service-running
{%- if action == 'reload' %}
      - cmd: salt-keysync-service-running-cmd-reload
{%- endif %}
