# salt-keysync %post ($1: 1 install, 2 upgrade). Not started on a first
# install: it needs this master's node name, peers and certificates first.
# The agent's folders and config, for the user it runs as (salt-master's).
/usr/lib/salt-keysync/owners
if [ -d /run/systemd/system ]; then
    # Also re-runs the generator that sets the unit's User=.
    systemctl daemon-reload >/dev/null 2>&1 || :
    if [ "$1" -ge 2 ]; then
        systemctl try-restart salt-keysync.service >/dev/null 2>&1 || :
    fi
fi
if [ "$1" -eq 1 ]; then
    echo "salt-keysync: edit /etc/salt-keysync/config.toml, then 'salt-keysync check' and 'systemctl enable --now salt-keysync'"
fi
