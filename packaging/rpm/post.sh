# salt-keysync %post ($1: 1 install, 2 upgrade). Not started on a first
# install: it needs this master's node name, peers and certificates first.
# The agent's folders and config, for the user it runs as (salt-master's).
/usr/lib/salt-keysync/owners
if [ -d /run/systemd/system ]; then
    # Also re-runs the generator that sets the unit's User=.
    systemctl daemon-reload >/dev/null 2>&1 || :
    # An upgrade restarts a running agent on the new binary; if it does not
    # start again, %post fails and says so (as the .deb's postinst does:
    # replication on this master has stopped).
    if [ "$1" -ge 2 ] && ! systemctl try-restart salt-keysync.service >/dev/null 2>&1; then
        echo "salt-keysync: the upgraded agent did not start again: replication on this master has stopped." >&2
        journalctl --no-pager -u salt-keysync -p err -n 5 -o cat 2>/dev/null | sed 's/^/salt-keysync:   /' >&2 || :
        echo "salt-keysync: fix the cause (journalctl -u salt-keysync -p err; salt-keysync check)," \
            "then: systemctl start salt-keysync" >&2
        exit 1
    fi
fi
if [ "$1" -eq 1 ]; then
    echo "salt-keysync: edit /etc/salt-keysync/config.toml, then 'salt-keysync check' and 'systemctl enable --now salt-keysync'"
fi
