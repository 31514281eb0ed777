# salt-keysync %postun ($1: 0 erase, 1 upgrade). RPM has no purge, so an
# erase does what `apt-get purge` does: the state and the agent's folder in
# Salt's pki_dir (.keysync-staging, whose marker names that state) go, so a
# reinstalled agent starts as a new master, re-learns every decision from
# its peers and never overrides them; the audit log in /var/log/salt-keysync
# STAYS unless asked:
#   SALT_KEYSYNC_PURGE_AUDIT=yes dnf remove salt-keysync
# A pki_dir other than /etc/salt/pki/master: remove its .keysync-staging by hand.
#
# The agent's user (the salt-master's, usually salt) owns pki_dir and the
# agent's folders, so it can put a symlink or anything else at every name in
# them. Root never moves or writes anything there: that is done with the
# privileges of the folder's owner (setpriv), so a planted symlink leads
# nowhere that user could not write itself. rm -rf of the agent's own
# folders, whose names only root controls (/var/lib and /var/log are
# root's), stays root's: rm never follows a symlink. Keep in step with
# packaging/debian/postrm; tests/packaging/salt-user-vs-scripts.sh plays
# that user against both.

# "UID GID" of folder $1 if root can act there with that user's privileges:
# a real folder (not a symlink), not writable by group or others.
folder_owner() {
    [ -d "$1" ] && [ ! -L "$1" ] || return 1
    case $(stat -c %A "$1") in
        ?????w???? | ????????w?) return 1 ;;
    esac
    stat -c '%u %g' "$1"
}

# Runs "$2..." as "UID GID" $1, without supplementary groups or capabilities.
as_user() {
    uid=${1% *} gid=${1#* }
    shift
    if [ "$uid" = 0 ]; then
        "$@"
    else
        setpriv --reuid="$uid" --regid="$gid" --clear-groups --inh-caps=-all -- "$@"
    fi
}

if [ "$1" -eq 0 ]; then
    pki=/etc/salt/pki/master
    state=/var/lib/salt-keysync
    logs=/var/log/salt-keysync
    staging=$pki/.keysync-staging
    if [ -e "$staging" ] || [ -L "$staging" ]; then
        # As pki_dir's owner: whatever stands at that name, only what that
        # user could remove itself goes.
        if ! owner=$(folder_owner "$pki") || ! as_user "$owner" rm -rf -- "$staging" \
            || [ -e "$staging" ] || [ -L "$staging" ]; then
            echo "salt-keysync: $staging not removed (only what $pki's owner can remove is): remove it by hand" >&2
        fi
    fi
    # An audit log left at its old default place (<state_dir>/audit.jsonl)
    # is moved aside, not deleted with the state, by the owner of both
    # folders (mv -T replaces a symlink at the destination name, never
    # follows it). Where that cannot be done, it stays in the state folder.
    kept_in_state=no
    if [ "${SALT_KEYSYNC_PURGE_AUDIT:-no}" != "yes" ]; then
        owner=$(folder_owner "$state") || owner=
        for log in "$state"/audit.jsonl*; do
            [ -f "$log" ] && [ ! -L "$log" ] || continue
            if [ -n "$owner" ] && [ ! -e "$logs" ] && [ ! -L "$logs" ]; then
                install -d -m 0700 -o "${owner% *}" -g "${owner#* }" "$logs" || true
            fi
            if [ -z "$owner" ] || [ "$(folder_owner "$logs" || true)" != "$owner" ] \
                || ! as_user "$owner" mv -f -T -- "$log" "$logs/from-state-${log##*/}"; then
                kept_in_state=yes
            fi
        done
    fi
    if [ "$kept_in_state" = yes ]; then
        # The state goes all the same, the old audit log stays.
        find "$state" -mindepth 1 -maxdepth 1 ! -name 'audit.jsonl*' -exec rm -rf -- {} +
        echo "salt-keysync: kept the audit log of its old default place in $state" \
            "(it could not be moved to $logs as the folders' owner)" >&2
    else
        rm -rf "$state"
    fi
    if [ "${SALT_KEYSYNC_PURGE_AUDIT:-no}" = "yes" ]; then
        rm -rf "$logs"
    elif [ -d "$logs" ]; then
        echo "salt-keysync: kept the audit log in $logs" \
            "(SALT_KEYSYNC_PURGE_AUDIT=yes on purge removes it)"
    fi
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
