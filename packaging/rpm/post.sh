# salt-keysync %post ($1: 1 install, 2 upgrade). Not started on a first
# install: it needs this master's node name, peers and certificates first.
install -d -m 0700 -o root -g root /var/lib/salt-keysync /var/log/salt-keysync
# Holds the TLS key and the config: root only.
chmod 0700 /etc/salt-keysync
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    if [ "$1" -ge 2 ]; then
        systemctl try-restart salt-keysync.service >/dev/null 2>&1 || :
    fi
fi
if [ "$1" -eq 1 ]; then
    echo "salt-keysync: edit /etc/salt-keysync/config.toml, then 'salt-keysync check' and 'systemctl enable --now salt-keysync'"
fi
