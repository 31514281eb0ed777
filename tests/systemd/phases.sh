# The steps of tests/systemd/run.sh (sourced), in the order it runs them:
# each leaves the cluster in a state the next one starts from.

PKI=/etc/salt/pki/master

# ---- helpers over the container's agent and Salt ----

unit_prop() { inside systemctl show --property="$1" --value salt-keysync; }

# The agent's status report as seen by root in the container, one field.
status_field() {
    inside salt-keysync status --json | python3 -c "$1"
}

peer_state() {
    status_field "import json, sys
report = json.load(sys.stdin)
print(next((p['state'] for p in report['peers'] if p['name'] == '$1'), 'absent'))"
}

peer_listed() { [ "$(peer_state "$1")" != absent ]; }

# journal_warns WORD WORD...: a line at warning priority or worse holds every WORD.
journal_warns() {
    local lines word
    lines=$(inside journalctl --no-pager -u salt-keysync -p warning -o cat)
    for word in "$@"; do
        lines=$(printf '%s\n' "$lines" | grep -i -- "$word") || return 1
    done
}

# restarted_as N OLD_PID: active, with NRestarts N and a main process other than OLD_PID.
restarted_as() {
    [ "$(unit_prop NRestarts)" = "$1" ] && [ "$(inside systemctl is-active salt-keysync)" = active ] \
        && [ "$(unit_prop MainPID)" != "$2" ]
}

watchdog_after() { [ "$(unit_prop WatchdogTimestampMonotonic)" -gt "$1" ]; }

# outside_peer_state NAME PEER: PEER's link state in the status of the
# agent NAME outside the container (its own link to PEER).
outside_peer_state() {
    { "$bin" status --json --config "$work/$1/config.toml" 2>/dev/null || true; } | python3 -c "import json, sys
report = json.load(sys.stdin)
print(next((p['state'] for p in report['peers'] if p['name'] == '$2'), 'absent'))"
}

expect_outside_peer_state() {
    local state
    state=$(outside_peer_state "$1" "$2") || return 1
    [ "$state" = "$3" ] || { echo "$2 is $state in $1's status"; return 1; }
}

expect_peer_state() {
    local state
    state=$(peer_state "$1") || return 1
    [ "$state" = "$2" ] || { echo "$1 is $state in master-a's status"; return 1; }
}

# pending_on_both ID...: a minion's key pending on master-a and master-b,
# as if it had sent it to both (written as salt-master 3008 writes it: by
# its user, mode 0600).
pending_on_both() {
    local id
    for id in "$@"; do
        inside install -o salt -g salt -m 0600 "keys/$id.pub" "$PKI/minions_pre/$id"
        install -m 0600 "$share/keys/$id.pub" "$work/master-b/pki/minions_pre/$id"
    done
}

# salt-key in the container, as the operator runs it there.
salt_key_in_a() { inside salt-key -y "$@" >>"$work/salt-key-a.log" 2>&1; }

# What `salt-key -L` in the container lists for ID.
salt_key_state_in_a() {
    inside salt-key -L --out=json 2>/dev/null | python3 -c "import json, sys
keys = json.load(sys.stdin)
for folder, state in (('minions_rejected', 'rejected'), ('minions', 'accepted'), ('minions_pre', 'pending')):
    if '$1' in keys.get(folder, []):
        print(state)
        break
else:
    print('absent')"
}

# write_config PEER...: master-a's config as the operator writes it
# (the packaged file's owner and mode stay: `cat >` keeps them).
write_config() {
    {
        cat <<EOF
node = "master-a"
listen = "$A_IP:4515"
audit_log = "/var/log/salt-keysync/audit.jsonl"

[tls]
ca = "/etc/salt-keysync/tls/ca.pem"
cert = "/etc/salt-keysync/tls/node.pem"
key = "/etc/salt-keysync/tls/node.key"
EOF
        local peer
        for peer in "$@"; do
            local var="${peer//-/_}_address"
            printf '\n[[peer]]\nname = "%s"\naddress = "%s"\n' "$peer" "${!var}"
        done
    } | inside sh -c 'cat >/etc/salt-keysync/config.toml'
}
master_b_address=$B_ADDR
master_c_address=$C_ADDR

# watch_dfn FILE OUT: polls a .dfn every 5 ms for 30 s in the background;
# OUT gets "appeared MODE UID CONTENT" when it shows up and "consumed" once
# it is gone again (Salt 3008 removes it only when it rotates the AES key).
watch_dfn() {
    python3 - "$1" "$2" <<'EOF' &
import os, sys, time
path, out = sys.argv[1], sys.argv[2]
seen = None
deadline = time.monotonic() + 30
with open(out, "w") as f:
    while time.monotonic() < deadline:
        try:
            st = os.stat(path)
            if seen is None:
                content = open(path).read().strip()
                seen = f"appeared {st.st_mode & 0o7777:o} {st.st_uid} {content}"
                print(seen, file=f, flush=True)
        except (FileNotFoundError, PermissionError):
            if seen is not None:
                print("consumed", file=f, flush=True)
                break
        time.sleep(0.005)
EOF
    dfn_watcher=$!
}

# expect_dfn_consumed OUT WHERE: the watcher saw a .dfn for Salt 3008 (mode
# 0400, owned by salt, holding the master's id) and saw it consumed.
expect_dfn_consumed() {
    wait "$dfn_watcher" || true
    local seen salt_uid
    seen=$(head -n 1 "$1")
    salt_uid=$(inside id -u salt)
    [ "$seen" = "appeared 400 $salt_uid master-a_master" ] || fail "$2: .dfn on master-a: '${seen:-never appeared}', not mode 400, uid $salt_uid, master-a_master"
    grep -qx consumed "$1" || fail "$2: master-a's salt-master did not consume .dfn within 30 s"
}

# ---- the steps ----

phase_salt_master() {
    step "salt-master $SALT_VERSION as a service with user: salt, as Salt's packages run it"
    inside sh -euc "
        # This master's host name (the tree holds the name of the host it was built on).
        echo master-a >/etc/hostname
        hostname master-a
        # What Salt's packages do at install: the salt user, and its folders.
        useradd --system --user-group --home-dir /opt/saltstack/salt --no-create-home --shell /usr/sbin/nologin salt
        install -d -o salt -g salt -m 0750 /var/log/salt
        mkdir -p /etc/salt
        cat >/etc/salt/master <<EOF
user: salt
interface: $A_IP
# The maintenance loop, which consumes .dfn, every second instead of every minute.
loop_interval: 1
EOF
        # Salt's own unit (pkg/common/salt-master.service).
        cat >/etc/systemd/system/salt-master.service <<EOF
[Unit]
Description=The Salt Master Server
After=network.target

[Service]
LimitNOFILE=100000
Type=notify
NotifyAccess=all
ExecStart=/usr/bin/salt-master

[Install]
WantedBy=multi-user.target
EOF
        systemctl daemon-reload
        systemctl enable --now salt-master
    " >"$work/salt-master-setup.out" 2>&1 || fail "salt-master did not start: $(tail -n 20 "$work/salt-master-setup.out")"
    # (Through the container's root: Salt 3008's master.pub is an absolute symlink.)
    eventually 90 "salt-master made its key folders and master.pub" \
        inside test -d $PKI/minions_rejected -a -e $PKI/master.pub
    local owner
    owner=$(inside stat -c %U "$PKI" "$PKI/minions" /proc/"$(inside systemctl show -P MainPID salt-master)")
    [ "$owner" = "$(printf 'salt\nsalt\nsalt')" ] || fail "pki_dir, minions/ and salt-master should be salt's: $owner"
    ok "salt-master runs as salt and owns $PKI (master.pem: $(inside stat -c %N $PKI/master.pem))"
}

phase_install() {
    step "the .deb, certificates and config as docs/operations.md says"
    run_doc_block install
    [ "$(inside dpkg-query -W -f '${Status}' salt-keysync)" = "install ok installed" ] || fail "salt-keysync is not installed"
    local modes
    modes=$(inside stat -c '%n %a %U:%G' /etc/salt-keysync /etc/salt-keysync/config.toml /var/lib/salt-keysync /var/log/salt-keysync)
    [ "$modes" = "/etc/salt-keysync 750 root:salt
/etc/salt-keysync/config.toml 640 root:salt
/var/lib/salt-keysync 700 salt:salt
/var/log/salt-keysync 700 salt:salt" ] || fail "the package's folders and config: $modes"
    ok "postinst: config readable by salt, not writable; state and log folders salt's"
    [ "$(unit_prop User)" = salt ] || fail "the unit's User= is '$(unit_prop User)', not salt (generator drop-in: $(inside systemctl cat salt-keysync | grep -A2 50-master-user))"
    ok "the generator set User=salt from /etc/salt/master"
    run_doc_block tls
    write_config master-b
    peer_setup master-b "$B_ADDR"
    peer_start master-b
    run_doc_block start
}

phase_unit() {
    step "the agent under the packaged unit"
    [ "$(inside systemctl is-active salt-keysync)" = active ] || fail "salt-keysync is not active"
    local pid caps
    pid=$(unit_prop MainPID)
    [ "$(inside stat -c %U "/proc/$pid")" = salt ] || fail "the agent runs as $(inside stat -c %U "/proc/$pid"), not salt"
    caps=$(inside grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' "/proc/$pid/status" | awk '{print $2}' | sort -u)
    [ "$caps" = 0000000000000000 ] || fail "the agent has capabilities: $(inside grep ^Cap "/proc/$pid/status")"
    ok "runs as salt with no capability at all"
    local salt_ids
    salt_ids="--setuid=$(inside id -u salt) --setgid=$(inside id -g salt)"
    # shellcheck disable=SC2086 # two options
    if out=$(inside nsenter --target "$pid" --mount --user $salt_ids cat $PKI/master.pem 2>&1); then
        fail "master.pem is readable with the agent's view and user"
    fi
    [[ "$out" == *"Permission denied"* ]] || fail "reading master.pem as the agent: $out"
    # shellcheck disable=SC2086
    inside nsenter --target "$pid" --mount --user $salt_ids cat $PKI/master.pub >/dev/null \
        || fail "master.pub is not readable with the agent's view and user"
    inside setpriv --reuid=salt --regid=salt --clear-groups cat $PKI/master.pem >/dev/null \
        || fail "master.pem should be readable by salt outside the unit (the control of the check above)"
    ok "master.pem out of the agent's reach (salt reads it outside the unit), master.pub readable"
    modes=$(inside stat -c '%n %a %U' $PKI/.keysync-staging /var/lib/salt-keysync/state.redb /var/log/salt-keysync/audit.jsonl)
    [ "$modes" = "$PKI/.keysync-staging 700 salt
/var/lib/salt-keysync/state.redb 600 salt
/var/log/salt-keysync/audit.jsonl 600 salt" ] || fail "the agent's files: $modes"
    ok "staging folder, state and audit log are salt's, private"
    local exposure
    exposure=$(inside systemd-analyze security --no-pager salt-keysync | sed -n 's/.*Overall exposure level for salt-keysync.service: \([0-9.]*\).*/\1/p')
    python3 -c "import sys; sys.exit(0 if float('$exposure') <= 1.5 else 1)" 2>/dev/null \
        || fail "systemd-analyze security rates the unit '$exposure', above 1.5: $(inside systemd-analyze security --no-pager salt-keysync | grep '✗')"
    ok "systemd-analyze security: $exposure"
    # Where the master runs as root, so does the agent (the unit without the
    # generator's drop-in, under another name): still within bounds.
    inside sh -c 'cp /usr/lib/systemd/system/salt-keysync.service /run/systemd/system/keysync-as-root.service && systemctl daemon-reload'
    exposure=$(inside systemd-analyze security --no-pager keysync-as-root | sed -n 's/.*Overall exposure level for keysync-as-root.service: \([0-9.]*\).*/\1/p')
    inside sh -c 'rm /run/systemd/system/keysync-as-root.service && systemctl daemon-reload'
    python3 -c "import sys; sys.exit(0 if float('$exposure') <= 1.5 else 1)" 2>/dev/null \
        || fail "systemd-analyze security rates the unit as root '$exposure', above 1.5"
    ok "systemd-analyze security as root: $exposure"
    inside systemd-analyze verify --man=no /usr/lib/systemd/system/salt-keysync.service >"$work/verify.out" 2>&1 \
        || fail "systemd-analyze verify: $(cat "$work/verify.out")"
    ok "systemd-analyze verify --man=no"
    # A folder salt-master makes after the agent started is writable to it
    # (pki_dir is one writable mount, not a mount per folder that existed).
    inside setpriv --reuid=salt --regid=salt --clear-groups mkdir $PKI/minions_autosign_later
    # shellcheck disable=SC2086
    inside nsenter --target "$pid" --mount --user $salt_ids touch $PKI/minions_autosign_later/probe \
        || fail "a folder made in pki_dir after the agent started is not writable to it"
    inside rm -r $PKI/minions_autosign_later
    ok "folders made in pki_dir after the start are writable to the agent"
    [ "$(unit_prop WatchdogUSec)" = 30s ] || fail "WatchdogUSec=$(unit_prop WatchdogUSec)"
    [ "$(unit_prop LimitNOFILE)" = 8192 ] || fail "LimitNOFILE=$(unit_prop LimitNOFILE)"
    [ ! -e "$(in_root /bin/kill)" ] || fail "the container has /bin/kill: the reload test proves nothing"
}

phase_replication() {
    step "salt-key on both sides: accept, reject, delete"
    pending_on_both web0 web1 web2 web3
    salt_key_on master-b -a web0
    eventually 15 "web0 accepted on master-b reaches master-a" expect_folder master-a "$(in_root $PKI)" web0 minions
    cmp -s "$work/master-b/pki/minions/web0" "$(in_root $PKI/minions/web0)" || fail "web0's key differs between master-b and master-a"
    [ "$(salt_key_state_in_a web0)" = accepted ] || fail "salt-key -L on master-a: web0 is $(salt_key_state_in_a web0)"
    replicated_key=$(inside stat -c '%U %a' $PKI/minions/web0)
    ok "accept on master-b: on master-a, byte for byte, salt-key -L lists it ($replicated_key)"

    # A reject or delete of an ACCEPTED key revokes it: the master must
    # rotate its AES key (.dfn). A pending key's needs no rotation.
    salt_key_on master-b -a web1
    eventually 15 "web1 accepted on master-b reaches master-a" expect_folder master-a "$(in_root $PKI)" web1 minions
    watch_dfn "$(in_root /var/cache/salt/master/.dfn)" "$work/dfn-reject"
    salt_key_on master-b -r web1 --include-accepted
    eventually 15 "web1 rejected on master-b reaches master-a" expect_folder master-a "$(in_root $PKI)" web1 minions_rejected
    expect_dfn_consumed "$work/dfn-reject" "reject on master-b"
    ok "reject on master-b: rejected on master-a, .dfn (0400, salt, master-a_master) consumed by its salt-master"

    watch_dfn "$(in_root /var/cache/salt/master/.dfn)" "$work/dfn-delete"
    salt_key_on master-b -d web0
    eventually 15 "web0 deleted on master-b is deleted on master-a" expect_folder master-a "$(in_root $PKI)" web0 absent
    expect_dfn_consumed "$work/dfn-delete" "delete on master-b"
    ok "delete on master-b: gone on master-a, .dfn consumed"

    salt_key_in_a -a web2
    salt_key_in_a -a web3
    eventually 15 "web2 accepted on master-a reaches master-b" expect_folder master-b "$work/master-b/pki" web2 minions
    eventually 15 "web3 accepted on master-a reaches master-b" expect_folder master-b "$work/master-b/pki" web3 minions
    ok "accept on master-a (salt-key in the container) reaches master-b"
    salt_key_in_a -r web3 --include-accepted
    eventually 15 "web3 rejected on master-a reaches master-b" expect_folder master-b "$work/master-b/pki" web3 minions_rejected
    eventually 5 "master-b's agent drops .dfn for web3" test -e "$work/master-b/cache/.dfn"
    ok "reject on master-a reaches master-b, with .dfn there"
    salt_key_in_a -d web2
    eventually 15 "web2 deleted on master-a is deleted on master-b" expect_folder master-b "$work/master-b/pki" web2 absent
    ok "delete on master-a reaches master-b"
    # Staging and adoption worked in place: no EXDEV fallback (dot files
    # staged inside the watched key folders, or keys copied).
    if inside journalctl --no-pager -u salt-keysync -o cat | grep -E "staging beside the keys|pending keys are copied|adopted by renaming"; then
        fail "the agent fell back from its staging folder: the key folders are not on one mount with it"
    fi
    ok "staged in .keysync-staging and pending keys linked into place: one mount, no fallback"
}

phase_status_and_journal() {
    step "salt-keysync status, as the operator runs it"
    inside salt-keysync status >"$work/status.out" 2>&1 || fail "salt-keysync status: $(cat "$work/status.out")"
    grep -q "master-b" "$work/status.out" && grep -qw up "$work/status.out" \
        || fail "status does not show master-b up: $(cat "$work/status.out")"
    eventually 10 "master-b up in status --json" expect_peer_state master-b up
    ok "status: master-b up ($(status_field "import json, sys; print(json.load(sys.stdin)['keys'])"))"
}

# Every line the agent wrote to the journal has the priority of its level:
# `journalctl -p warning` shows warnings and errors, and only them.
expect_journal_priorities() {
    inside journalctl --no-pager -u salt-keysync -o json >"$work/journal.json"
    python3 - "$work/journal.json" "$@" <<'EOF' || fail "journal priorities: $(cat "$work/journal.check")"
import json, re, sys
want = {"TRACE": 7, "DEBUG": 7, "INFO": 6, "WARN": 4, "ERROR": 3}
bad, seen = [], {}
for line in open(sys.argv[1]):
    entry = json.loads(line)
    if entry.get("SYSLOG_IDENTIFIER") != "salt-keysync":
        continue
    message, priority = entry.get("MESSAGE", ""), int(entry.get("PRIORITY", 6))
    if not isinstance(message, str):
        continue
    level = re.match(r"\s*(TRACE|DEBUG|INFO|WARN|ERROR) ", message)
    if level:
        expected = want[level.group(1)]
    elif message.startswith("salt-keysync: ") or message.startswith("FAIL "):
        expected = 3  # the binary's own error line, check's FAIL lines
    else:
        expected = priority
    seen[priority] = seen.get(priority, 0) + 1
    if priority != expected:
        bad.append(f"priority {priority}, expected {expected}: {message}")
needed = [int(p) for p in sys.argv[2:]]
missing = [p for p in needed if p not in seen]
with open(sys.argv[1].replace(".json", ".check"), "w") as out:
    print("; ".join(bad[:5]) or f"no line at priority {missing} (seen {seen})", file=out)
sys.exit(1 if bad or missing else 0)
EOF
}

phase_reload() {
    step "systemctl reload: a new peer, then a refused config"
    peer_setup master-c "$C_ADDR"
    write_config master-b master-c
    inside systemctl reload salt-keysync >"$work/reload.out" 2>&1 || fail "systemctl reload with a new peer: $(cat "$work/reload.out")"
    eventually 10 "master-c in master-a's status after the reload" peer_listed master-c
    ok "reload: master-c added without a restart"
    eventually 30 "a warning that names master-c and why it cannot connect" journal_warns master-c "refused"
    ok "a connect failure is a warning with its cause: $(inside journalctl --no-pager -u salt-keysync -p warning -o cat | grep master-c | tail -n 1)"
    peer_start master-c
    eventually 30 "master-c up in master-a's status" expect_peer_state master-c up
    eventually 30 "web1, rejected before master-c existed, reaches master-c" \
        expect_folder master-c "$work/master-c/pki" web1 minions_rejected
    ok "master-c caught up (web1 rejected there)"

    local pid
    pid=$(unit_prop MainPID)
    inside sed -i "s/^listen = .*/listen = \"$A_IP:4516\"/" /etc/salt-keysync/config.toml
    if inside systemctl reload salt-keysync >"$work/reload-refused.out" 2>&1; then
        fail "systemctl reload of a config that changes listen succeeded"
    fi
    [ "$(inside systemctl is-active salt-keysync)" = active ] && [ "$(unit_prop MainPID)" = "$pid" ] \
        || fail "the agent did not survive a refused reload"
    inside journalctl --no-pager -u salt-keysync -p err -o cat | grep -q "listen" \
        || fail "the refused reload's reason is not in journalctl -p err"
    ok "a refused reload fails systemctl reload; the agent runs on with the old config"
    write_config master-b master-c
    inside systemctl reload salt-keysync >"$work/reload.out" 2>&1 || fail "reload of the restored config: $(cat "$work/reload.out")"
    expect_journal_priorities 3 4 6
    ok "journal: every line at its level's priority (info, warning, err all seen)"
}

phase_restart_and_kill() {
    step "systemctl restart, then kill -9"
    local pid n
    pid=$(unit_prop MainPID)
    inside systemctl restart salt-keysync || fail "systemctl restart failed"
    [ "$(inside systemctl is-active salt-keysync)" = active ] && [ "$(unit_prop MainPID)" != "$pid" ] \
        || fail "no new agent after systemctl restart"
    local stop_ms
    stop_ms=$((($(unit_prop InactiveEnterTimestampMonotonic) - $(unit_prop ActiveExitTimestampMonotonic)) / 1000))
    ok "restart: a new agent ($stop_ms ms to stop)"
    eventually 30 "master-b up again after the restart" expect_peer_state master-b up

    pending_on_both web4
    n=$(unit_prop NRestarts)
    pid=$(unit_prop MainPID)
    inside sh -c "kill -9 $pid"
    # Decided while master-a's agent is dead (systemd waits RestartSec=2s).
    salt_key_on master-b -a web4
    eventually 30 "systemd restarts the killed agent" restarted_as "$((n + 1))" "$pid"
    eventually 30 "web4, accepted on master-b while master-a's agent was dead, reaches master-a" \
        expect_folder master-a "$(in_root $PKI)" web4 minions
    local id
    for id in web0 web1 web2 web3; do
        [ "$(folder_of "$(in_root $PKI)" $id)" = "$(folder_of "$work/master-b/pki" $id)" ] \
            || fail "$id differs after kill -9: master-a $(folder_of "$(in_root $PKI)" $id), master-b $(folder_of "$work/master-b/pki" $id)"
    done
    inside salt-keysync audit verify >"$work/verify-audit.out" 2>&1 || fail "audit verify after kill -9: $(cat "$work/verify-audit.out")"
    ok "kill -9: restarted by systemd ($(unit_prop NRestarts) restart), nothing lost, audit chain intact"
    watchdog_mark=$(unit_prop WatchdogTimestampMonotonic)
}

phase_logrotate_and_watchdog() {
    step "logrotate, and the watchdog"
    inside logrotate --force /etc/logrotate.d/salt-keysync >"$work/logrotate.out" 2>&1 \
        || fail "logrotate: $(cat "$work/logrotate.out")"
    pending_on_both web5
    salt_key_on master-b -a web5
    eventually 15 "web5 reaches master-a" expect_folder master-a "$(in_root $PKI)" web5 minions
    eventually 10 "a new audit.jsonl after the rotation" test -s "$(in_root /var/log/salt-keysync/audit.jsonl)"
    [ "$(inside stat -c '%a %U' /var/log/salt-keysync/audit.jsonl)" = "600 salt" ] \
        || fail "the new audit.jsonl: $(inside stat -c '%a %U' /var/log/salt-keysync/audit.jsonl)"
    inside sh -c 'salt-keysync audit verify /var/log/salt-keysync/audit.jsonl-* /var/log/salt-keysync/audit.jsonl' \
        >"$work/verify-rotated.out" 2>&1 || fail "audit verify across the rotation: $(cat "$work/verify-rotated.out")"
    ok "logrotate: the agent (as salt) continues the chain in a new audit.jsonl of its own"
    eventually 20 "the agent pings the watchdog (WATCHDOG=1 every 15 s)" watchdog_after "$watchdog_mark"
    ok "the watchdog is fed"
}

phase_state_lost() {
    step "a lost state: refused at err priority, not retried, recovered as the docs say"
    inside systemctl stop salt-keysync
    inside rm -rf /var/lib/salt-keysync
    if inside systemctl start salt-keysync >/dev/null 2>&1; then
        fail "the agent started with its state lost"
    fi
    # Failed, not "auto-restart"; a start by hand counts restarts from 0 again.
    [ "$(unit_prop SubState)" = failed ] && [ "$(unit_prop NRestarts)" = 0 ] \
        || fail "a lost state should fail the unit for good, not restart it: $(unit_prop SubState), NRestarts $(unit_prop NRestarts)"
    [ "$(unit_prop ExecMainStatus)" = 78 ] || fail "run exited $(unit_prop ExecMainStatus), not 78 (EX_CONFIG)"
    inside journalctl --no-pager -u salt-keysync -p err -o cat | grep "state lost" | grep -q "recover --from-peers" \
        || fail "journalctl -p err does not say the state is lost and how to recover"
    ok "state lost: the unit fails once (status 78), the cause and the fix at err priority"
    if inside salt-keysync check >"$work/check-lost.out" 2>&1; then
        fail "salt-keysync check passes with the state lost"
    fi
    grep -q "state lost" "$work/check-lost.out" || fail "check does not say the state is lost: $(cat "$work/check-lost.out")"
    ok "salt-keysync check says the state is lost"
    run_doc_block recover
    [ "$(inside systemctl is-active salt-keysync)" = active ] || fail "not active after recover"
    local owners
    owners=$(inside find /var/lib/salt-keysync -mindepth 1 ! -user salt)
    [ -z "$owners" ] || fail "recover left files salt does not own: $owners"
    [ "$(inside stat -c '%a' /var/lib/salt-keysync/state.redb)" = 600 ] || fail "state.redb mode after recover"
    pending_on_both web6
    salt_key_in_a -a web6
    eventually 15 "web6 accepted on master-a after the recovery reaches master-b" \
        expect_folder master-b "$work/master-b/pki" web6 minions
    ok "recover run by root: salt's files, mode 0600; replication goes on"
}

phase_upgrade() {
    step "upgrade under a running cluster, without a terminal, over the edited config"
    local pid config
    pid=$(unit_prop MainPID)
    config=$(inside cat /etc/salt-keysync/config.toml)
    # The operator's config (write_config) against a package whose example
    # changed: a conffile would stop at dpkg's question here.
    if inside cmp -s /etc/salt-keysync/config.toml /usr/share/salt-keysync/config.toml; then
        fail "the config is still the package's example: the upgrade below would prove nothing"
    fi
    run_doc_block upgrade upgrade
    [ "$(inside dpkg-query -W -f '${Version}' salt-keysync)" = "${version%-*}-99" ] || fail "not upgraded"
    [ "$(inside cat /etc/salt-keysync/config.toml)" = "$config" ] || fail "the upgrade changed the operator's config"
    [ "$(inside stat -c '%a %U:%G' /etc/salt-keysync/config.toml)" = "640 root:salt" ] \
        || fail "the config after the upgrade: $(inside stat -c '%a %U:%G' /etc/salt-keysync/config.toml)"
    inside grep -q "changed in revision 99" /usr/share/salt-keysync/config.toml || fail "the new example is not installed"
    ok "apt-get install -y without a terminal: upgraded, no question, the edited config kept, the new example beside it"
    eventually 30 "the upgraded agent runs" restarted_as "$(unit_prop NRestarts)" "$pid"
    [ "$(unit_prop User)" = salt ] || fail "User= after the upgrade: $(unit_prop User)"
    pending_on_both web7
    salt_key_on master-b -a web7
    eventually 15 "web7 reaches master-a after the upgrade" expect_folder master-a "$(in_root $PKI)" web7 minions
    ok "upgrade: restarted on the new package, still salt, replicating"
    # Versions mean something: the older build is a downgrade, which apt
    # refuses under -y unless asked (--allow-downgrades).
    if inside --no-terminal apt-get install -y "./$(basename "$deb")" </dev/null >"$work/downgrade.out" 2>&1; then
        fail "apt-get install -y of the older $(basename "$deb") over ${version%-*}-99 succeeded"
    fi
    grep -q "downgrade" "$work/downgrade.out" || fail "the refused downgrade does not say why: $(tail -n 5 "$work/downgrade.out")"
    [ "$(inside dpkg-query -W -f '${Version}' salt-keysync)" = "${version%-*}-99" ] || fail "the refused downgrade changed the package"
    ok "apt-get install -y of the older build is refused as a downgrade"
}

phase_remove_purge_reinstall() {
    step "dpkg -r, dpkg -P, and a reinstall"
    local keys_before
    keys_before=$(inside sh -c "cd $PKI && ls minions minions_pre minions_rejected")
    run_doc_block remove
    [ "$(inside systemctl is-active salt-keysync)" != active ] || fail "the agent runs after dpkg -r"
    local path
    for path in /usr/bin/salt-keysync /usr/lib/systemd/system-generators/salt-keysync-generator \
        /run/systemd/generator/salt-keysync.service.d; do
        [ ! -e "$(in_root $path)" ] || fail "dpkg -r left $path"
    done
    for path in /etc/salt-keysync/config.toml /var/lib/salt-keysync/state.redb /var/log/salt-keysync/audit.jsonl \
        $PKI/.keysync-staging/.salt-keysync-state; do
        [ -e "$(in_root $path)" ] || fail "dpkg -r removed $path"
    done
    [ "$(inside sh -c "cd $PKI && ls minions minions_pre minions_rejected")" = "$keys_before" ] || fail "dpkg -r changed the keys"
    ok "dpkg -r: agent stopped and gone; config, state, audit log, marker and keys kept"

    # Decided while the agent is away: the reinstalled one must learn it.
    pending_on_both web8
    salt_key_on master-b -a web8
    keys_before=$(inside sh -c "cd $PKI && ls minions minions_pre minions_rejected")
    run_doc_block purge
    for path in /var/lib/salt-keysync /etc/salt-keysync/config.toml $PKI/.keysync-staging; do
        [ ! -e "$(in_root $path)" ] || fail "dpkg -P left $path"
    done
    for path in /var/log/salt-keysync/audit.jsonl /etc/salt-keysync/tls/node.key; do
        [ -e "$(in_root $path)" ] || fail "dpkg -P removed $path"
    done
    [ "$(inside sh -c "cd $PKI && ls minions minions_pre minions_rejected")" = "$keys_before" ] || fail "dpkg -P changed the keys"
    [ "$(inside systemctl is-active salt-master)" = active ] || fail "salt-master stopped with the purge"
    ok "dpkg -P: state, config and .keysync-staging gone; audit log, TLS files, keys kept"

    run_doc_block install
    write_config master-b master-c
    run_doc_block start
    eventually 30 "web8, accepted on master-b while the agent was away, reaches the reinstalled master-a" \
        expect_folder master-a "$(in_root $PKI)" web8 minions
    eventually 30 "master-b up after the reinstall" expect_peer_state master-b up
    ok "reinstalled after the purge: starts as a new master and catches up"
}

# Last, so that every other check has run when it fails: a key the agent
# put in place is as Salt 3008's own salt-key leaves it (owner salt, 0600).
phase_key_modes() {
    step "key files as Salt 3008 writes them"
    [ "$replicated_key" = "salt 600" ] \
        || fail "a replicated key on master-a is '$replicated_key' (owner, mode); Salt 3008 writes 'salt 600'"
    ok "replicated keys: owner salt, mode 0600, as Salt 3008 writes them"
}
