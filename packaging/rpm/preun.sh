# salt-keysync %preun ($1: 0 erase, 1 upgrade): stop and disable on erase.
if [ "$1" -eq 0 ]; then
    if [ -d /run/systemd/system ]; then
        systemctl stop salt-keysync.service >/dev/null 2>&1 || :
    fi
    systemctl disable salt-keysync.service >/dev/null 2>&1 || :
fi
