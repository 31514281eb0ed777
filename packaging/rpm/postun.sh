# salt-keysync %postun ($1: 0 erase, 1 upgrade). RPM has no purge, so an
# erase does what `apt-get purge` does: the state and the agent's folder in
# Salt's pki_dir (.keysync-staging, whose marker names that state) go, so a
# reinstalled agent starts as a new master, re-learns every decision from
# its peers and never overrides them; the audit log in /var/log/salt-keysync
# STAYS unless asked:
#   SALT_KEYSYNC_PURGE_AUDIT=yes dnf remove salt-keysync
# A pki_dir other than /etc/salt/pki/master: remove its .keysync-staging by hand.
if [ "$1" -eq 0 ]; then
    rm -rf /etc/salt/pki/master/.keysync-staging
    for log in /var/lib/salt-keysync/audit.jsonl*; do
        [ -f "$log" ] || continue
        install -d -m 0700 /var/log/salt-keysync
        mv "$log" "/var/log/salt-keysync/from-state-$(basename "$log")"
    done
    rm -rf /var/lib/salt-keysync
    if [ "${SALT_KEYSYNC_PURGE_AUDIT:-no}" = "yes" ]; then
        rm -rf /var/log/salt-keysync
    fi
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
