#!/usr/bin/env bash
# Plays the salt user against the package's maintainer scripts (issue 27,
# item 9): the Debian postrm (purge), the RPM %postun (erase) and
# packaging/owners (run by both packages' post-install scripts). They run as
# root in and around folders the salt user owns (pki_dir, and the agent's
# state and log folders, since the agent runs as the salt-master's user), so
# that user can put a symlink or another folder at any name they use, before
# they run or between a check and the act. Each scenario does that as the
# salt user (setpriv) and checks that root did nothing through it: nothing
# written, moved, given away or deleted outside what the script is for, and
# the scripts still do what they are for (state removed, audit log kept).
#
#   tests/packaging/salt-user-vs-scripts.sh SCRATCH postrm|postun|owners|format|postinst
#
# `format`: the Debian preinst and prerm and the RPM %pre, which read the
# state store's format beside it (state.format, in the salt user's state
# folder) to refuse a downgrade (issue 29 item 5). `postinst`: an upgrade
# whose agent does not start again fails (systemctl and journalctl are
# stand-ins here: the namespace has no systemd). `owners` also runs
# `salt-keysync hand-over` (the binary given in SALT_KEYSYNC_BIN, else
# target/debug/salt-keysync), installed as /usr/bin/salt-keysync.
#
# Run by tests/tests/it/maintainer_scripts.rs as root, inside
# `unshare --mount`: SCRATCH becomes a tmpfs holding the upper layers of
# overlays over /etc and /usr, and tmpfs hide /var/lib, /var/log, /run and
# /etc/salt, so the scripts run at their real absolute paths while the
# host's files are never touched (everything goes with the namespace). A
# `salt` user is added to the overlay's /etc/passwd if the host has none.
# Prints one line per scenario; exits 1 naming every scenario that failed.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
scratch=${1:?usage: $0 SCRATCH postrm|postun|owners}
which=${2:?usage: $0 SCRATCH postrm|postun|owners|format|postinst}
bin=${SALT_KEYSYNC_BIN:-${CARGO_TARGET_DIR:-$repo/target}/debug/salt-keysync}

[ "$(id -u)" = 0 ] || { echo "needs root (it runs the maintainer scripts as root)" >&2; exit 2; }
if [ "$(readlink /proc/self/ns/mnt)" = "$(readlink /proc/1/ns/mnt)" ]; then
    echo "run inside a mount namespace of its own (unshare --mount): it mounts over /etc, /usr, /var/lib and /var/log" >&2
    exit 2
fi

# ---- a throwaway host at the real paths ----
mount -t tmpfs -o mode=0700 keysync-test "$scratch"
for top in etc usr; do
    mkdir "$scratch/$top.upper" "$scratch/$top.work"
    mount -t overlay keysync-test -o "lowerdir=/$top,upperdir=$scratch/$top.upper,workdir=$scratch/$top.work" "/$top"
done
for dir in /var/lib /var/log /run; do
    mount -t tmpfs -o mode=0755 keysync-test "$dir"
done
mkdir -p /etc/salt
mount -t tmpfs -o mode=0755 keysync-test /etc/salt

if ! salt_uid=$(id -u salt 2>/dev/null); then
    salt_uid=64000
    while getent passwd "$salt_uid" >/dev/null || getent group "$salt_uid" >/dev/null; do
        salt_uid=$((salt_uid + 1))
    done
    echo "salt:x:$salt_uid:$salt_uid:salt-keysync test:/nonexistent:/usr/sbin/nologin" >>/etc/passwd
    echo "salt:x:$salt_uid:" >>/etc/group
fi
salt_gid=$(id -g salt)
# What the salt user does, with its privileges only.
as_salt() { setpriv --reuid="$salt_uid" --regid="$salt_gid" --clear-groups --inh-caps=-all -- "$@"; }

pki=/etc/salt/pki/master
staging=$pki/.keysync-staging
state=/var/lib/salt-keysync
logs=/var/log/salt-keysync
# The folder the salt user would like root to drop a file into: what is
# there is sourced by every root shell.
victim=/etc/bash_completion.d
install -d -m 0755 "$victim"
ls -A "$victim" >"$scratch/victim.before"

# `stat` as the scripts see it: after root looks at the path in
# /run/race.path, the salt user runs /run/race.sh (once). This is the salt
# user winning the race between a script's check and its act, every time.
mkdir "$scratch/shim"
cat >"$scratch/shim/stat" <<EOF
#!/bin/sh
/usr/bin/stat "\$@"
rc=\$?
if [ -f /run/race.path ]; then
    path=\$(cat /run/race.path)
    for arg in "\$@"; do
        if [ "\$arg" = "\$path" ]; then
            rm -f /run/race.path
            setpriv --reuid=$salt_uid --regid=$salt_gid --clear-groups --inh-caps=-all -- sh -e /run/race.sh
            break
        fi
    done
fi
exit \$rc
EOF
chmod 0755 "$scratch/shim/stat"
race_after_stat_of() {
    printf '%s\n' "$1" >/run/race.path
    cat >/run/race.sh
}

failures=()
scenario=""
fail() {
    echo "FAIL [$which: $scenario] $*"
    failures+=("$scenario: $*")
}
ok() { echo "ok   [$which: $scenario]"; }

# Every file and folder under the overlays' upper layers (what differs from
# the host's /etc and /usr), with owner, mode, size and time: what a script
# changed there shows up as a changed line.
upper_listing() {
    (cd "$scratch" && find etc.upper usr.upper -mindepth 1 -printf '%p %U:%G %m %y %s %T@\n' | sort)
}
snapshot() {
    upper_listing >"$scratch/before"
    ls -lAn --time-style=+%s.%N /etc/salt >"$scratch/etc-salt.before"
}
# Nothing changed in /etc and /usr but under the prefixes given (paths
# relative to the upper layers, e.g. etc.upper/salt-keysync), nor in
# /etc/salt itself.
nothing_else_changed() {
    local allowed=("$@")
    upper_listing >"$scratch/after"
    local line path prefix changed=()
    while IFS= read -r line; do
        path=${line%% *}
        for prefix in "${allowed[@]}"; do
            case $path in "$prefix" | "$prefix"/*) continue 2 ;; esac
        done
        changed+=("$line")
    done < <(diff "$scratch/before" "$scratch/after" | sed -n 's/^[<>] //p')
    [ ${#changed[@]} -eq 0 ] || fail "root changed /etc or /usr: ${changed[*]}"
    if [ -n "$(ls -A "$victim" 2>/dev/null | grep -v -x -f "$scratch/victim.before" || true)" ]; then
        fail "root wrote into $victim: $(ls -lA "$victim")"
    fi
    ls -lAn --time-style=+%s.%N /etc/salt >"$scratch/etc-salt.after"
    diff -q "$scratch/etc-salt.before" "$scratch/etc-salt.after" >/dev/null \
        || fail "root changed /etc/salt: $(diff "$scratch/etc-salt.before" "$scratch/etc-salt.after" | sed -n 's/^> //p')"
}

owner_of() { stat -c '%U:%G' "$1"; }

# A master whose agent runs as salt: Salt's folders, the agent's state with
# an audit log at its old default place (and a rotated one), its log folder
# and its staging folder with the state marker, all the salt user's, as
# systemd and the agent leave them.
salt_host() {
    rm -rf /etc/salt/* /etc/salt-keysync "$state" "$logs" /run/race.path
    # Whatever an earlier scenario's script put in the victim's folder goes.
    (cd "$victim" && ls -A | grep -v -x -f "$scratch/victim.before" | xargs -r rm -rf --) || true
    printf 'user: salt\n' >/etc/salt/master
    install -d -m 0755 /etc/salt/pki
    install -d -m 0700 -o salt -g salt "$pki"
    for folder in minions minions_pre minions_rejected; do
        install -d -m 0755 -o salt -g salt "$pki/$folder"
    done
    # systemd makes these two for the unit's user (StateDirectory=, LogsDirectory=).
    install -d -m 0700 -o salt -g salt "$state" "$logs"
    as_salt sh -ec "
        umask 077
        mkdir $staging
        echo 'store 0123 node master-a' >$staging/.salt-keysync-state
        echo state >$state/state.redb
        echo '{\"seq\":1,\"old\":\"current\"}' >$state/audit.jsonl
        echo '{\"seq\":0,\"old\":\"rotated\"}' >$state/audit.jsonl-20250101
        echo '{\"seq\":2,\"new\":true}' >$logs/audit.jsonl
    "
}

# A folder of root's in pki_dir, which only root can empty (say a backup
# root made there): the salt user can rename it within pki_dir, not delete
# what is in it.
roots_folder_in_pki() {
    install -d -m 0700 "$pki/backup"
    echo "root's secret" >"$pki/backup/secret"
    chmod 0600 "$pki/backup/secret"
}

# ---- the Debian postrm (purge) and the RPM %postun (erase) ----
remove_scripts() {
    local script arg
    case $which in
        postrm) script=$repo/packaging/debian/postrm arg=purge ;;
        postun) script=$repo/packaging/rpm/postun.sh arg=0 ;;
    esac
    # As dpkg and rpm run them: a clean environment, from /.
    run() { (cd / && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@" sh "$script" "$arg") >"$scratch/out" 2>&1; }
    # What a purge leaves whatever the salt user did: no state, no staging
    # folder of the agent's, the audit log kept.
    purged() {
        [ ! -e "$state/state.redb" ] || fail "the state was not removed: $(ls -la "$state")"
        [ -f "$logs/audit.jsonl" ] || fail "the audit log in $logs is gone"
    }

    scenario="symlinks to root's folders at the names the old audit logs are moved to"
    salt_host
    as_salt ln -s "$victim" "$logs/from-state-audit.jsonl"
    as_salt ln -s /etc/salt "$logs/from-state-audit.jsonl-20250101"
    snapshot
    run || fail "exit status $?: $(cat "$scratch/out")"
    nothing_else_changed
    purged
    [ ! -e "$state" ] || fail "$state left: $(ls -la "$state")"
    [ ! -e "$staging" ] || fail "the staging folder was not removed"
    [ -f "$logs/from-state-audit.jsonl" ] && [ ! -L "$logs/from-state-audit.jsonl" ] \
        && grep -qs current "$logs/from-state-audit.jsonl" \
        || fail "the old audit log is not $logs/from-state-audit.jsonl: $(ls -la "$logs")"
    [ ${#failures[@]} -gt 0 ] || ok

    scenario="a folder of root's renamed to the staging folder's name"
    n=${#failures[@]}
    salt_host
    roots_folder_in_pki
    as_salt sh -ec "rm -rf $staging; mv $pki/backup $staging"
    snapshot
    run || fail "exit status $?: $(cat "$scratch/out")"
    nothing_else_changed
    purged
    [ -f "$staging/secret" ] && [ "$(owner_of "$staging/secret")" = root:root ] \
        || fail "root deleted its own folder that the salt user put at $staging (the salt user could not have)"
    grep -qs "$staging not removed.*remove it by hand" "$scratch/out" || fail "not told: $(cat "$scratch/out")"
    [ ${#failures[@]} -gt "$n" ] || ok

    scenario="a folder at a destination name: that log stays in the state folder, the state goes"
    n=${#failures[@]}
    salt_host
    as_salt mkdir "$logs/from-state-audit.jsonl"
    snapshot
    run || fail "exit status $?: $(cat "$scratch/out")"
    nothing_else_changed
    purged
    grep -qs current "$state/audit.jsonl" || fail "the old audit log that could not be moved is gone"
    grep -qs rotated "$logs/from-state-audit.jsonl-20250101" || fail "the rotated log was not moved: $(ls -la "$logs")"
    [ "$(ls -A "$state" 2>/dev/null)" = audit.jsonl ] || fail "$state holds more than the log kept: $(ls -A "$state" 2>&1)"
    grep -qs "kept the audit log of its old default place in $state" "$scratch/out" \
        || fail "not told: $(cat "$scratch/out")"
    [ ${#failures[@]} -gt "$n" ] || ok

    scenario="the log folder is another user's than the state folder: nothing moved between them"
    n=${#failures[@]}
    salt_host
    chown root:root "$logs" "$logs/audit.jsonl"
    snapshot
    run || fail "exit status $?: $(cat "$scratch/out")"
    nothing_else_changed
    purged
    grep -qs current "$state/audit.jsonl" && grep -qs rotated "$state/audit.jsonl-20250101" \
        || fail "the old audit logs are gone: $(ls -la "$state" "$logs")"
    [ ! -e "$logs/from-state-audit.jsonl" ] || fail "moved across owners: $(ls -la "$logs")"
    [ ${#failures[@]} -gt "$n" ] || ok

    scenario="SALT_KEYSYNC_PURGE_AUDIT=yes, with a symlink at a destination name"
    n=${#failures[@]}
    salt_host
    as_salt ln -s "$victim" "$logs/from-state-audit.jsonl"
    snapshot
    run SALT_KEYSYNC_PURGE_AUDIT=yes || fail "exit status $?: $(cat "$scratch/out")"
    nothing_else_changed
    for gone in "$state" "$logs" "$staging"; do
        [ ! -e "$gone" ] || fail "$gone left with SALT_KEYSYNC_PURGE_AUDIT=yes"
    done
    [ ${#failures[@]} -gt "$n" ] || ok

    scenario="an agent that ran as root (no salt user in its folders)"
    n=${#failures[@]}
    salt_host
    chown -R root:root "$state" "$logs" "$staging"
    chown root:root "$pki"
    snapshot
    run || fail "exit status $?: $(cat "$scratch/out")"
    nothing_else_changed
    purged
    [ ! -e "$state" ] && [ ! -e "$staging" ] || fail "state or staging folder left"
    grep -qs current "$logs/from-state-audit.jsonl" && grep -qs rotated "$logs/from-state-audit.jsonl-20250101" \
        || fail "the old audit logs were not moved to $logs: $(ls -la "$logs")"
    [ ${#failures[@]} -gt "$n" ] || ok
}

# ---- packaging/owners, as an upgrade from an agent that ran as root runs it ----
owners_script() {
    install -d -m 0755 /usr/lib/salt-keysync
    install -m 0755 "$repo/packaging/owners" "$repo/packaging/master-user" /usr/lib/salt-keysync/
    [ -x "$bin" ] || { echo "no salt-keysync binary at $bin (cargo build -p salt-keysync, or SALT_KEYSYNC_BIN)" >&2; exit 2; }
    install -m 0755 "$bin" /usr/bin/salt-keysync
    # The shim's `stat` first: the salt user acts right after root's look.
    run() {
        (cd / && env -i PATH="$scratch/shim:/usr/sbin:/usr/bin:/sbin:/bin" /usr/lib/salt-keysync/owners) \
            >"$scratch/out" 2>&1
    }
    # What the older agent, running as root, left: its own staging folder
    # (with the marker), TLS key, state and log folders, all root's.
    root_agent_host() {
        salt_host
        chown -R root:root "$state" "$logs" "$staging"
        install -d -m 0755 /etc/salt-keysync
        echo 'node = "master-a"' >/etc/salt-keysync/config.toml
        chmod 0600 /etc/salt-keysync/config.toml
        install -d -m 0700 /etc/salt-keysync/tls
        echo key >/etc/salt-keysync/tls/node.key
        chmod 0600 /etc/salt-keysync/tls/node.key
    }
    handed_over() {
        [ "$(stat -c '%a %U:%G' /etc/salt-keysync)" = "750 root:salt" ] \
            || fail "/etc/salt-keysync: $(stat -c '%a %U:%G' /etc/salt-keysync)"
        [ "$(stat -c '%a %U:%G' /etc/salt-keysync/config.toml)" = "640 root:salt" ] \
            || fail "config.toml: $(stat -c '%a %U:%G' /etc/salt-keysync/config.toml)"
    }

    scenario="a folder of root's swapped in for the staging folder between the check and the chown"
    root_agent_host
    roots_folder_in_pki
    race_after_stat_of "$staging" <<EOF
mv $staging $pki/.keysync-staging.moved
mv $pki/backup $staging
EOF
    snapshot
    run || fail "exit status $?: $(cat "$scratch/out")"
    nothing_else_changed etc.upper/salt-keysync
    handed_over
    [ "$(stat -c '%a %U:%G' /etc/salt-keysync/tls/node.key)" = "600 salt:salt" ] \
        || fail "node.key not handed over: $(stat -c '%a %U:%G' /etc/salt-keysync/tls/node.key)"
    for path in "$pki/backup" "$staging" "$pki/backup/secret" "$staging/secret"; do
        [ ! -e "$path" ] || [ "$(owner_of "$path")" = root:root ] \
            || fail "root gave $path (its folder the salt user put at $staging) to $(owner_of "$path")"
    done
    [ ${#failures[@]} -gt 0 ] || ok

    scenario="the older agent's staging folder is left to the agent, and the operator told"
    n=${#failures[@]}
    root_agent_host
    snapshot
    run || fail "exit status $?: $(cat "$scratch/out")"
    nothing_else_changed etc.upper/salt-keysync
    handed_over
    [ "$(stat -c '%a %U:%G' /etc/salt-keysync/tls)" = "750 root:salt" ] \
        || fail "tls: $(stat -c '%a %U:%G' /etc/salt-keysync/tls)"
    [ "$(stat -c '%a %U:%G' "$staging")" = "700 root:root" ] && [ "$(owner_of "$staging/.salt-keysync-state")" = root:root ] \
        || fail "root acted on the staging folder in pki_dir: $(ls -laR "$staging")"
    grep -qs "moves it aside at its next start" "$scratch/out" || fail "not told: $(cat "$scratch/out")"
    [ ${#failures[@]} -gt "$n" ] || ok

    scenario="node.key swapped for a symlink between the check and the chown, in a tls folder salt can write"
    n=${#failures[@]}
    root_agent_host
    chown salt:salt /etc/salt-keysync/tls
    race_after_stat_of /etc/salt-keysync/tls/node.key <<EOF
rm -f /etc/salt-keysync/tls/node.key
ln -s /etc/salt/master /etc/salt-keysync/tls/node.key
EOF
    snapshot
    run || fail "exit status $?: $(cat "$scratch/out")"
    nothing_else_changed etc.upper/salt-keysync
    handed_over
    [ "$(owner_of /etc/salt/master)" = root:root ] || fail "root gave /etc/salt/master to $(owner_of /etc/salt/master)"
    grep -qs "node.key not handed over" "$scratch/out" || fail "not told: $(cat "$scratch/out")"
    [ ${#failures[@]} -gt "$n" ] || ok

    # Issue 29 item 5: a downgrade's agent and recover, run as root, left
    # the lock and the marker root's in the salt user's staging folder and
    # the store root's 0644; the agent, running as salt, exited 78 on them.
    root_files_in_salts_folders() {
        salt_host
        install -d -m 0755 /etc/salt-keysync
        printf '# salt-keysync: the state store that syncs this pki_dir\nstore 0123abcd\nnode master-a\n' \
            >"$staging/.salt-keysync-state"
        echo 4711 >"$staging/.salt-keysync-lock"
        printf 'redb\032\n\251\r\n%064d' 0 >"$state/state.redb"
        chown root:root "$staging/.salt-keysync-state" "$staging/.salt-keysync-lock" "$state/state.redb"
        chmod 0600 "$staging/.salt-keysync-state" "$staging/.salt-keysync-lock"
        chmod 0644 "$state/state.redb"
    }
    scenario="root's lock, marker and store in the salt user's folders are handed over"
    n=${#failures[@]}
    root_files_in_salts_folders
    snapshot
    run || fail "exit status $?: $(cat "$scratch/out")"
    nothing_else_changed etc.upper/salt-keysync
    for path in "$staging/.salt-keysync-state" "$staging/.salt-keysync-lock" "$state/state.redb"; do
        [ "$(stat -c '%a %U' "$path")" = "600 salt" ] || fail "$path: $(stat -c '%a %U' "$path"), not 600 salt"
    done
    [ ${#failures[@]} -gt "$n" ] || ok

    scenario="a file of root's the salt user renames to the marker's name, and a symlink at the lock's"
    n=${#failures[@]}
    root_files_in_salts_folders
    # A backup of root's in pki_dir, which salt can rename but not read.
    printf -- '-----BEGIN RSA PRIVATE KEY-----\nroot only\n' >"$pki/master.pem.bak"
    chmod 0600 "$pki/master.pem.bak"
    as_salt sh -ec "mv -f $pki/master.pem.bak $staging/.salt-keysync-state; rm -f $staging/.salt-keysync-lock
        ln -s /etc/salt/master $staging/.salt-keysync-lock"
    snapshot
    run || fail "exit status $?: $(cat "$scratch/out")"
    nothing_else_changed etc.upper/salt-keysync
    [ "$(stat -c '%a %U' "$staging/.salt-keysync-state")" = "600 root" ] \
        || fail "root gave its file the salt user put at the marker's name away: $(stat -c '%a %U' "$staging/.salt-keysync-state")"
    [ "$(owner_of /etc/salt/master)" = root:root ] || fail "root gave /etc/salt/master to $(owner_of /etc/salt/master)"
    grep -qs "not what the agent writes there" "$scratch/out" || fail "not told: $(cat "$scratch/out")"
    [ "$(stat -c '%a %U' "$state/state.redb")" = "600 salt" ] || fail "the store was not handed over"
    [ ${#failures[@]} -gt "$n" ] || ok
}

# ---- the state store's format: Debian preinst and prerm, RPM %pre ----
format_scripts() {
    # script, its arguments, and whether it must refuse a store of format 9
    local cases=(
        "$repo/packaging/debian/preinst|upgrade 0.2.0-1 0.1.9-1"
        "$repo/packaging/debian/prerm|failed-upgrade 9.0.0-1 0.1.9-1"
        "$repo/packaging/rpm/pre.sh|2"
    )
    run() { (cd / && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin timeout 20 sh "$script" $args) >"$scratch/out" 2>&1; }
    format_file() { printf '# salt-keysync\nformat %s\nwritten-by 9.1.0\nread-since 9.0.0\n' "$1"; }
    local entry script args
    for entry in "${cases[@]}"; do
        script=${entry%%|*} args=${entry#*|}

        scenario="${script##*/}: a store of a newer format is refused, naming both releases"
        n=${#failures[@]}
        salt_host
        format_file 9 | as_salt sh -c "cat >$state/state.format"
        snapshot
        if run; then fail "not refused: $(cat "$scratch/out")"; fi
        for said in "format 9 (written by salt-keysync 9.1.0)" "install salt-keysync 9.0.0 or later" "recover --from-peers"; do
            grep -qF "$said" "$scratch/out" || fail "does not say '$said': $(cat "$scratch/out")"
        done
        nothing_else_changed
        [ ${#failures[@]} -gt "$n" ] || ok

        scenario="${script##*/}: a store of this format, or none, passes"
        n=${#failures[@]}
        salt_host
        format_file 2 | as_salt sh -c "cat >$state/state.format"
        run || fail "refused a store of format 2: $(cat "$scratch/out")"
        format_file 9 | as_salt sh -c "cat >$state/state.format; rm $state/state.redb"
        run || fail "refused without a store: $(cat "$scratch/out")"
        [ ${#failures[@]} -gt "$n" ] || ok

        scenario="${script##*/}: the folder root's (0.1.0's postinst made it so): read by root"
        n=${#failures[@]}
        salt_host
        format_file 9 >"$state/state.format"
        chown -R root:root "$state"
        if run; then fail "not refused: $(cat "$scratch/out")"; fi
        [ ${#failures[@]} -gt "$n" ] || ok

        scenario="${script##*/}: state.format a symlink to a file of root's, or a FIFO: not followed, not waited on"
        n=${#failures[@]}
        salt_host
        format_file 9 >/etc/salt/format-of-roots
        chmod 0600 /etc/salt/format-of-roots
        as_salt ln -s /etc/salt/format-of-roots "$state/state.format"
        snapshot
        run || fail "root read through the salt user's symlink: $(cat "$scratch/out")"
        nothing_else_changed
        as_salt sh -ec "rm $state/state.format; mkfifo $state/state.format"
        run || fail "exit status $? with a FIFO at state.format: $(cat "$scratch/out")"
        rm -f /etc/salt/format-of-roots
        [ ${#failures[@]} -gt "$n" ] || ok
    done

    scenario="prerm upgrade: a downgrade below the release that first reads the store's format"
    n=${#failures[@]}
    salt_host
    printf '# salt-keysync\nformat 2\nwritten-by 0.2.0\nread-since 0.2.0\n' | as_salt sh -c "cat >$state/state.format"
    script=$repo/packaging/debian/prerm args="upgrade 0.1.0-1"
    if run; then fail "a downgrade to 0.1.0-1 was not refused: $(cat "$scratch/out")"; fi
    grep -qF "refusing to downgrade to salt-keysync 0.1.0-1" "$scratch/out" || fail "not told: $(cat "$scratch/out")"
    args="upgrade 0.2.1-1"
    run || fail "an upgrade to 0.2.1-1 was refused: $(cat "$scratch/out")"
    [ ${#failures[@]} -gt "$n" ] || ok
}

# ---- the Debian postinst on an upgrade: an agent that does not start again fails it ----
postinst_script() {
    install -d -m 0755 /usr/lib/salt-keysync /usr/share/salt-keysync /run/systemd/system
    install -m 0755 "$repo/packaging/owners" "$repo/packaging/master-user" /usr/lib/salt-keysync/
    install -m 0644 "$repo/packaging/config.toml" /usr/share/salt-keysync/config.toml
    [ -x "$bin" ] || { echo "no salt-keysync binary at $bin" >&2; exit 2; }
    install -m 0755 "$bin" /usr/bin/salt-keysync
    # Stand-ins: try-restart fails with status $TRY_RESTART, as systemctl
    # does when the restarted unit fails (exit 78); journalctl says why.
    mkdir -p "$scratch/fake"
    cat >"$scratch/fake/systemctl" <<'EOS'
#!/bin/sh
echo "systemctl $*" >>/run/systemctl.log
case $1 in try-restart) exit "${TRY_RESTART:-0}" ;; esac
exit 0
EOS
    cat >"$scratch/fake/journalctl" <<'EOS'
#!/bin/sh
echo "salt-keysync: cannot read /etc/salt/pki/master/.keysync-staging/.salt-keysync-state: Permission denied"
EOS
    chmod 0755 "$scratch/fake/systemctl" "$scratch/fake/journalctl"
    run() {
        (cd / && env -i PATH="$scratch/fake:/usr/sbin:/usr/bin:/sbin:/bin" TRY_RESTART="$1" \
            sh "$repo/packaging/debian/postinst" configure 0.1.9-1) >"$scratch/out" 2>&1
    }

    scenario="the upgraded agent does not start again: postinst fails and says why"
    salt_host
    if run 1; then fail "postinst succeeded although the agent did not start: $(cat "$scratch/out")"; fi
    grep -qs "did not start again" "$scratch/out" && grep -qs "Permission denied" "$scratch/out" \
        && grep -qs "dpkg --configure -a" "$scratch/out" || fail "not told: $(cat "$scratch/out")"
    grep -qs "try-restart salt-keysync.service" /run/systemctl.log || fail "no try-restart: $(cat /run/systemctl.log)"
    [ ${#failures[@]} -gt 0 ] || ok

    scenario="the upgraded agent starts again: postinst succeeds"
    n=${#failures[@]}
    salt_host
    run 0 || fail "exit status $?: $(cat "$scratch/out")"
    [ ${#failures[@]} -gt "$n" ] || ok
}

case $which in
    postrm | postun) remove_scripts ;;
    owners) owners_script ;;
    format) format_scripts ;;
    postinst) postinst_script ;;
    *) echo "unknown script $which (postrm, postun, owners, format, postinst)" >&2; exit 2 ;;
esac
if [ ${#failures[@]} -gt 0 ]; then
    echo "$which: ${#failures[@]} check(s) failed"
    exit 1
fi
