# salt-keysync %pre ($1: 1 install, 2 upgrade or downgrade): refuses to put
# this package in place over a state store it cannot read (a downgrade below
# the store's format). RPM runs the new package's %pre before anything of it
# is installed and the old package's %preun only afterwards, so this is the
# only place an RPM downgrade can be stopped. (Not run by the tests, which
# have no RPM distribution; the .deb's preinst holds the same lines.)

# ---- the state store's format: keep in step in packaging/debian/preinst,
# packaging/debian/prerm and packaging/rpm/pre.sh (tests/it/downgrade.rs
# checks they agree with agent/store/src/format.rs). This package reads
# state stores of format $reads and older.
reads=2
state=/var/lib/salt-keysync

# The format of the store in $state as the agent wrote it beside the store
# (state.format): sets found_format, found_by and found_since; false when
# there is no store or nothing to read. The agent's user owns the folder
# and could put a symlink or a FIFO at that name: it is read as that user,
# never through a link, never waiting; what is kept of it is checked
# characters only.
store_format() {
    found_format='' found_by='' found_since=''
    [ -d "$state" ] && [ ! -L "$state" ] && [ -f "$state/state.redb" ] || return 1
    case $(stat -c %A "$state") in ?????w???? | ????????w?) return 1 ;; esac
    owner=$(stat -c '%u %g' "$state") || return 1
    if [ "${owner% *}" = 0 ]; then
        text=$(dd if="$state/state.format" iflag=nofollow,nonblock bs=4096 count=1 status=none 2>/dev/null) || return 1
    else
        text=$(setpriv --reuid="${owner% *}" --regid="${owner#* }" --clear-groups --inh-caps=-all -- \
            dd if="$state/state.format" iflag=nofollow,nonblock bs=4096 count=1 status=none 2>/dev/null) || return 1
    fi
    found_format=$(printf '%s\n' "$text" | sed -n 's/^format \([0-9]\{1,9\}\)$/\1/p' | head -n 1)
    found_by=$(printf '%s\n' "$text" | sed -n 's/^written-by \([0-9A-Za-z.+~-]\{1,64\}\)$/\1/p' | head -n 1)
    found_since=$(printf '%s\n' "$text" | sed -n 's/^read-since \([0-9A-Za-z.+~-]\{1,64\}\)$/\1/p' | head -n 1)
    [ -n "$found_format" ]
}

# Says why $1 is refused, and the ways out.
refuse_format() {
    echo "salt-keysync: $1: the state store in $state is in format $found_format (written by salt-keysync" \
        "${found_by:-?}), which releases before ${found_since:-?} cannot read." >&2
    echo "salt-keysync: either install salt-keysync ${found_since:-?} or later, or go back to the older release" \
        "with a state rebuilt from the peers: systemctl stop salt-keysync; mv $state/state.redb" \
        "$state/state.redb.newer; install the older package; salt-keysync recover --from-peers" \
        "(/usr/share/doc/salt-keysync/recovery.md)." >&2
}
# ---- end of the state store's format

if store_format && [ "$found_format" -gt "$reads" ]; then
    refuse_format "refusing to install this package (it reads formats up to $reads)"
    echo "salt-keysync: Nothing was changed." >&2
    exit 1
fi
