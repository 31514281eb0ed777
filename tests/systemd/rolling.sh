# A rolling upgrade from the previous release (issue 29), sourced by
# tests/systemd/run.sh after phases.sh and run first, on the fresh container:
# a site of three masters on the previous release (tests/upgrade/
# previous-release, built from its commit by tests/upgrade/build.sh): the
# container's from its own .deb under systemd, master-b's and master-c's as
# processes of its binary. Then one master at a time goes to this build:
# master-b, the container's (the docs' `apt-get install -y` without a
# terminal, while salt-key runs on the others), master-c. After each step,
# accept, reject and delete decisions made with salt-key on an upgraded and
# on an old master are timed until every other master shows them: each
# within a second (a delete of an accepted key within a second after the
# guard's quiet second, which upgraded masters wait by design), and every
# key is where the decisions put it on all three (nothing lost, no deleted
# key back). The docs' upgrade compatibility policy is run as written.
# Then the site is taken down (the package purged, the outside masters'
# folders moved aside) and the phases after it start from a fresh master.

# pki_of NAME: that master's pki_dir, as the host sees it.
pki_of() {
    case $1 in
        master-a) in_root "$PKI" ;;
        *) echo "$work/$1/pki" ;;
    esac
}

# roll_peer_start NAME BINARY: that master's agent, a process of BINARY.
roll_peer_start() {
    SALT_KEYSYNC_LOG=info "$2" run --config "$work/$1/config.toml" >>"$work/$1/agent.log" 2>&1 {lock}>&- &
    eval "pid_${1//-/_}=$!"
    roll_bin[$1]=$2
}

# roll_status NAME: that master's agent's `status --json`.
roll_status() {
    case $1 in
        master-a) inside salt-keysync status --json ;;
        *) "${roll_bin[$1]}" status --config "$work/$1/config.toml" --json ;;
    esac
}

# roll_links_up: every running agent has every peer up.
roll_links_up() {
    local name
    for name in "${!roll_running[@]}"; do
        roll_status "$name" | python3 -c "import json, sys
peers = {p['name']: p['state'] for p in json.load(sys.stdin)['peers']}
down = {n: s for n, s in peers.items() if s != 'up'}
sys.exit(f'$name: {down}' if down or len(peers) != 2 else 0)" || return 1
    done
}

# roll_timings FILE: the outside masters' and the container's agents retry
# a link every second at most (reconnect_max; 30 s by default), so that a
# step's restarts are followed within seconds. Anti-entropy keeps its
# default (a minute): a decision that arrives within a second came live.
roll_timings() { printf '\n[timings]\nreconnect_max = "1s"\n'; }

# roll_pending ID...: a minion's key pending on all three masters, as if it
# had sent it to each (on master-a as salt-master 3008 writes it).
roll_pending() {
    local id name
    for id in "$@"; do
        inside install -o salt -g salt -m 0600 "keys/$id.pub" "$PKI/minions_pre/$id"
        for name in master-b master-c; do
            install -m 0600 "$share/keys/$id.pub" "$work/$name/pki/minions_pre/$id"
        done
    done
}

# roll_salt_key NAME ARGS...: salt-key on that master.
roll_salt_key() {
    local name=$1
    shift
    case $name in
        master-a) salt_key_in_a "$@" ;;
        *) salt_key_on "$name" "$@" ;;
    esac
}

# roll_next: the next unused minion id (roll00, roll01, ...).
roll_next() {
    roll_id=$(printf 'roll%02d' "$roll_used")
    roll_used=$((roll_used + 1))
    [ -f "$share/keys/$roll_id.pub" ] || fail "rolling.sh used more minion keys than run.sh made ($roll_id)"
}

# roll_measure ORIGIN WHAT ID FOLDER LIMIT_MS SALT-KEY-ARGS...: runs salt-key
# on ORIGIN and times until every other running master shows ID in FOLDER
# ("absent" for a delete), counted from the moment ORIGIN shows it; fails
# past LIMIT_MS. Each figure is kept for the summary by the versions of its
# two ends.
roll_measure() {
    local origin=$1 what=$2 id=$3 want=$4 limit=$5 out roots=() name poller ms figures=()
    shift 5
    out="$work/arrival-$id-${what// /-}"
    for name in "${!roll_running[@]}"; do roots+=("$name=$(pki_of "$name")"); done
    python3 "$here/arrival.py" "$id" "$want" "$origin" 15 "${roots[@]}" >"$out" 2>&1 &
    poller=$!
    eventually 10 "the arrival poller for $id started" grep -qx ready "$out"
    roll_salt_key "$origin" "$@" || fail "salt-key $* on $origin failed"
    wait "$poller" || fail "$what $id on $origin: $(tail -n 1 "$out")"
    roll_expected[$id]=$want
    while read -r name ms; do
        [ "$name" = ready ] && continue
        [ "$ms" != never ] || fail "$what $id on $origin (${roll_version[$origin]}): not on $name (${roll_version[$name]}) within 15 s"
        figures+=("$name (${roll_version[$name]}) $ms ms")
        roll_figures+=("${roll_version[$origin]}>${roll_version[$name]} $what $ms")
        [ "$ms" -le "$limit" ] || fail "$what $id on $origin (${roll_version[$origin]}) reached $name (${roll_version[$name]}) in $ms ms, over $limit ms"
    done <"$out"
    local joined
    joined=$(printf '%s, ' "${figures[@]}")
    ok "$what $id on $origin (${roll_version[$origin]}) -> ${joined%, }"
}

# roll_round ORIGIN: the decisions on one master, each timed to the others:
# accept, reject (of the accepted key), delete (of the rejected key), each
# within a second; then accept and delete of another key: a delete of an
# accepted key waits on an upgraded master until the origin has deleted
# nothing for a second (the blast-radius guard's quiet), then within a second.
roll_round() {
    local origin=$1 x y
    roll_next
    x=$roll_id
    roll_next
    y=$roll_id
    roll_pending "$x" "$y"
    roll_measure "$origin" accept "$x" minions 1000 -a "$x"
    roll_measure "$origin" reject "$x" minions_rejected 1000 -r "$x" --include-accepted
    roll_measure "$origin" delete "$x" absent 1000 -d "$x"
    roll_measure "$origin" accept "$y" minions 1000 -a "$y"
    roll_measure "$origin" "delete-accepted" "$y" absent 2000 -d "$y"
}

# roll_in_place: every key decided so far is where its last decision put
# it, on every master; deleted ones nowhere.
roll_in_place() {
    local id name
    for id in "${!roll_expected[@]}"; do
        for name in master-a master-b master-c; do
            expect_folder "$name" "$(pki_of "$name")" "$id" "${roll_expected[$id]}" || return 1
        done
    done
}

# roll_decide_during ORIGIN ID FOLDER SALT-KEY-ARGS...: a decision made while
# another master is being upgraded, checked once that one is back.
roll_decide_during() {
    local origin=$1 id=$2 want=$3
    shift 3
    roll_salt_key "$origin" "$@" || fail "salt-key $* on $origin during the upgrade failed"
    roll_expected[$id]=$want
}

# roll_peer_upgrade NAME: master-b's or master-c's agent stopped, a decision
# made on each of the two others meanwhile, the agent started again as this
# build on the same config, state and audit log.
roll_peer_upgrade() {
    local name=$1 others=() id1 id2 other
    for other in master-a master-b master-c; do [ "$other" = "$name" ] || others+=("$other"); done
    step "upgrade $name (a process) to ${version%-*}, while the others decide"
    roll_next
    id1=$roll_id
    roll_next
    id2=$roll_id
    roll_pending "$id1" "$id2"
    peer_stop "$name"
    unset "roll_running[$name]"
    roll_decide_during "${others[0]}" "$id1" minions -a "$id1"
    roll_decide_during "${others[1]}" "$id2" minions_rejected -r "$id2"
    roll_peer_start "$name" "$bin"
    roll_version[$name]=${version%-*}
    roll_running[$name]=1
    eventually 30 "every link up after $name's upgrade" roll_links_up
    eventually 30 "the decisions made while $name was upgraded reach it, the rest still in place" roll_in_place
    ok "$name runs ${version%-*} ($("$bin" --version)); the two decisions made meanwhile reached it"
}

# roll_cluster_rows: master-a's `status --cluster --json`, one line per
# master: NAME LINK AGENT; then the masters the agent-version warning names.
roll_cluster_rows() {
    inside salt-keysync status --cluster --json | python3 -c "import json, sys
report = json.load(sys.stdin)
for m in report['masters']:
    print(m['name'], m['link'] or 'this', m['agent_version'])
print('agent-version:', ' '.join(sorted(m for f in report['findings'] if f['kind'] == 'agent-version' for m in f['masters'])))"
}

phase_rolling_upgrade() {
    local prev_ver=${prev_version} new_ver=${version%-*}
    declare -gA roll_version=([master-a]=$prev_ver [master-b]=$prev_ver [master-c]=$prev_ver)
    declare -gA roll_running=([master-a]=1 [master-b]=1 [master-c]=1)
    declare -gA roll_bin=() roll_expected=()
    roll_used=0
    roll_figures=()
    roll_started=$SECONDS

    step "a site on the previous release, $prev_ver ($prev_commit, built from git): the container's from its .deb"
    inside --no-terminal sh -euc "cd /srv/keysync/previous && apt-get install -y ./salt-keysync_${prev_ver}-1_amd64.deb" \
        </dev/null >"$work/previous-install.out" 2>&1 || fail "apt-get install of $prev_ver: $(tail -n 15 "$work/previous-install.out")"
    [ "$(inside dpkg-query -W -f '${Version}' salt-keysync)" = "$prev_ver-1" ] || fail "$prev_ver-1 is not installed"
    # Its TLS files and config as its own docs installed them: root's.
    inside sh -euc '
        install -d -m 0700 /etc/salt-keysync/tls
        install -m 0644 ca.pem /etc/salt-keysync/tls/ca.pem
        install -m 0644 master-a.pem /etc/salt-keysync/tls/node.pem
        install -m 0600 master-a.key /etc/salt-keysync/tls/node.key'
    write_config master-b master-c
    roll_timings | inside sh -c 'cat >>/etc/salt-keysync/config.toml'
    config_before=$(inside cat /etc/salt-keysync/config.toml)
    for name in master-b master-c; do
        peer_setup "$name" "$(if [ "$name" = master-b ]; then echo "$B_ADDR"; else echo "$C_ADDR"; fi)"
        roll_timings >>"$work/$name/config.toml"
        roll_peer_start "$name" "$prev_bin"
    done
    inside --no-terminal sh -euc 'salt-keysync check && systemctl enable --now salt-keysync' </dev/null \
        >"$work/previous-start.out" 2>&1 || fail "$prev_ver did not start: $(tail -n 15 "$work/previous-start.out")"
    [ "$(inside salt-keysync --version)" = "salt-keysync $prev_ver" ] || fail "the container's agent is $(inside salt-keysync --version)"
    [ "$(inside stat -c %U "/proc/$(unit_prop MainPID)")" = root ] || fail "$prev_ver's agent should run as root, as it did"
    eventually 60 "every link of the $prev_ver site up" roll_links_up
    ok "$prev_ver on all three: master-a under systemd as root (its unit), master-b and master-c as processes; every link up"
    roll_round master-a
    roll_round master-c

    roll_peer_upgrade master-b
    roll_round master-b
    roll_round master-a

    step "upgrade master-a (the container) to $new_ver as the docs say, without a terminal, while the others decide"
    local pid
    pid=$(unit_prop MainPID)
    # Minions waiting on every master for the decisions made meanwhile.
    local waiting=() n
    for n in 1 2 3 4; do
        roll_next
        waiting+=("$roll_id")
    done
    roll_pending "${waiting[@]}"
    # The docs' upgrade commands, in the folder holding this build's .deb
    # (and only it), in the background: salt-key runs on master-b and
    # master-c, in turn, until they are done (twice at least, four at most).
    (run_doc_block upgrade .) &
    local upgrading=$!
    unset "roll_running[master-a]"
    local made=0 while_running=0 id
    for id in "${waiting[@]}"; do
        if [ "$made" -ge 2 ] && ! kill -0 "$upgrading" 2>/dev/null; then
            break
        fi
        kill -0 "$upgrading" 2>/dev/null && while_running=$((while_running + 1))
        if [ $((made % 2)) -eq 0 ]; then
            roll_decide_during master-b "$id" minions -a "$id"
        else
            roll_decide_during master-c "$id" minions_rejected -r "$id"
        fi
        made=$((made + 1))
    done
    wait "$upgrading" || fail "the docs' upgrade commands failed (above)"
    ok "the docs' 'upgrade' commands from $prev_ver, verbatim, without a terminal; $made decisions on master-b and master-c meanwhile, $while_running of them begun while apt-get ran"
    roll_version[master-a]=$new_ver
    roll_running[master-a]=1
    [ "$(inside dpkg-query -W -f '${Version}' salt-keysync)" = "$version" ] || fail "$version is not installed"
    eventually 30 "the upgraded agent runs" restarted_as "$(unit_prop NRestarts)" "$pid"
    [ "$(inside stat -c %U "/proc/$(unit_prop MainPID)")" = salt ] || fail "the upgraded agent runs as $(inside stat -c %U "/proc/$(unit_prop MainPID)"), not salt"
    # What docs/operations.md and CHANGELOG.md say an upgrade from 0.1.0 does.
    [ "$(inside cat /etc/salt-keysync/config.toml)" = "$config_before" ] || fail "the upgrade changed the edited config"
    [ "$(inside stat -c '%a %U:%G' /etc/salt-keysync/config.toml)" = "640 root:salt" ] \
        || fail "the config after the upgrade: $(inside stat -c '%a %U:%G' /etc/salt-keysync/config.toml)"
    inside dpkg-query -W -f '${Conffiles}' salt-keysync | grep -q "/etc/salt-keysync/config.toml .* obsolete" \
        || fail "dpkg does not keep the config as an obsolete conffile: $(inside dpkg-query -W -f '${Conffiles}' salt-keysync)"
    ok "the edited config of $prev_ver kept (an obsolete conffile), 0640 root:salt"
    [ "$(inside stat -c '%U %a' /etc/salt-keysync/tls/node.key /etc/salt-keysync/tls)" = "salt 600
root 750" ] || fail "the TLS key after the upgrade: $(inside stat -c '%n %U:%G %a' /etc/salt-keysync/tls/node.key /etc/salt-keysync/tls)"
    local refused
    refused=$(inside sh -c "ls -d $PKI/.keysync-staging.refused-*" 2>/dev/null) || fail "the root-owned staging folder of $prev_ver was not moved aside"
    [ "$(inside stat -c %U "$PKI/.keysync-staging")" = salt ] || fail "the new staging folder is $(inside stat -c %U "$PKI/.keysync-staging")'s"
    inside journalctl --no-pager -u salt-keysync -p err -o cat | grep -qF "$(basename "$refused")" \
        || fail "the journal's errors do not name $(basename "$refused")"
    ok "handed over to salt: node.key, and $prev_ver's staging folder moved aside as $(basename "$refused") (named in the journal)"
    eventually 30 "master-a's status shows every peer up" roll_links_up
    eventually 30 "the decisions made while master-a was upgraded reach it, the rest still in place" roll_in_place
    inside salt-keysync audit verify >"$work/rolling-audit.out" 2>&1 \
        || fail "audit verify across the upgrade: $(cat "$work/rolling-audit.out")"
    ok "the decisions made on master-b and master-c meanwhile reached master-a; its audit chain goes on across the upgrade"

    # The policy, as docs/operations.md words it: the commands it gives,
    # and what it says they show while releases mix.
    run_doc_block rolling
    local oldest rows
    oldest=$(sed -n "s/^salt-keysync $new_ver (protocol [0-9]*, oldest peer protocol \([0-9]*\))\$/\1/p" "$work/doc-rolling.out")
    [ -n "$oldest" ] && [ "$oldest" -le "$prev_protocol" ] \
        || fail "--version should name $new_ver and an oldest peer protocol of at most $prev_protocol (the previous release's): $(head -n 1 "$work/doc-rolling.out")"
    grep -E "^master-c +up .* $prev_ver +.*warning agent-version" "$work/doc-rolling.out" >/dev/null \
        || fail "status --cluster does not show master-c up, on $prev_ver, with the agent-version warning: $(cat "$work/doc-rolling.out")"
    rows=$(roll_cluster_rows)
    [ "$rows" = "master-a this $new_ver
master-b up $new_ver
master-c up $prev_ver
agent-version: master-a master-b master-c" ] || fail "status --cluster --json while releases mix: $rows"
    ok "the policy's commands: $new_ver speaks down to protocol $oldest; status --cluster shows master-c on $prev_ver, up, and the agent-version warning"
    roll_round master-a
    roll_round master-c

    roll_peer_upgrade master-c
    roll_round master-c
    roll_round master-b

    step "the site on $new_ver: nothing lost, no deleted key back"
    run_doc_block rolling
    rows=$(roll_cluster_rows)
    [ "$rows" = "master-a this $new_ver
master-b up $new_ver
master-c up $new_ver
agent-version: " ] || fail "status --cluster --json after the upgrade: $rows"
    ok "status --cluster: every master on $new_ver, up, no agent-version warning"
    # Past a few more anti-entropy rounds at link-up: a restart of each agent.
    peer_stop master-b
    peer_stop master-c
    roll_peer_start master-b "$bin"
    roll_peer_start master-c "$bin"
    inside systemctl restart salt-keysync
    eventually 30 "every link up after restarting all three" roll_links_up
    roll_in_place || fail "after restarting all three: $(roll_in_place 2>&1)"
    local n_decided=${#roll_expected[@]} accepted=0 rejected=0 deleted=0 id
    for id in "${!roll_expected[@]}"; do
        case ${roll_expected[$id]} in
            minions) accepted=$((accepted + 1)) ;;
            minions_rejected) rejected=$((rejected + 1)) ;;
            absent) deleted=$((deleted + 1)) ;;
        esac
    done
    ok "$n_decided keys where their last decision put them on all three masters ($accepted accepted, $rejected rejected, $deleted deleted and still absent), after restarting all three"
    roll_summary

    step "the site taken down: the phases after this start from a fresh master"
    peer_stop master-b
    peer_stop master-c
    mv "$work/master-b" "$work/rolling-master-b"
    mv "$work/master-c" "$work/rolling-master-c"
    inside --no-terminal sh -euc "
        systemctl disable --now salt-keysync
        dpkg --purge salt-keysync
        rm -rf /etc/salt-keysync /var/log/salt-keysync $PKI/.keysync-staging.refused-*
        rm -f $PKI/minions/roll* $PKI/minions_pre/roll* $PKI/minions_rejected/roll*
        # The phases after this read the unit's whole journal (priorities,
        # warnings naming a peer, no staging fallback): none of this site's.
        journalctl --rotate --vacuum-size=1
    " </dev/null >"$work/rolling-down.out" 2>&1 || fail "taking the site down: $(tail -n 15 "$work/rolling-down.out")"
    [ -z "$(inside sh -c "ls -A /etc/salt-keysync /var/lib/salt-keysync $PKI/.keysync-staging" 2>/dev/null)" ] \
        || fail "salt-keysync left files behind"
    [ -z "$(inside journalctl --no-pager -q -u salt-keysync -o cat)" ] \
        || fail "the journal still holds this site's lines: $(inside journalctl --no-pager -q -u salt-keysync -o cat | tail -n 3)"
    ok "purged, journal emptied; master-b's and master-c's folders moved aside"
}

# The largest figure of each kind of decision, by the releases at its ends.
roll_summary() {
    printf '%s\n' "${roll_figures[@]}" | awk '
        { key = $1 " " $2; n[key]++; if (!(key in max) || $3 > max[key]) max[key] = $3 }
        END { for (key in n) printf "     %-28s %-16s n=%-3d max %4d ms\n", substr(key, 1, index(key, " ") - 1), substr(key, index(key, " ") + 1), n[key], max[key] }
    ' | sort
    ok "rolling upgrade: ${#roll_figures[@]} arrivals timed, each within its bound ($((SECONDS - roll_started)) s since the site's install)"
}
