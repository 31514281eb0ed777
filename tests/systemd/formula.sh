# The Salt formula (packaging/salt-formula, as the .deb ships it) applied
# to master-a after a purge, as a fresh master (sourced by
# tests/systemd/run.sh, after phases.sh), from the container's salt-master
# (user: salt) to a salt-minion master-a beside it: the pillar the docs
# write is one that master can read (a folder it cannot enter gives an empty
# pillar, and the formula says so); the agent the formula starts replicates
# with master-b and master-c outside, a second run changes nothing, a new
# build masterless (salt-call --local) upgrades, a peer or certificate
# change reloads, another key restarts, a failing `salt-keysync check`
# leaves the agent untouched until fixed, and salt_keysync.clean undoes it.
# The commands docs/formula.md marks run verbatim.

# formula_pillar PEER... [-- YAML-LINE...]: master-a's config pillar, the
# package $formula_source (from the shared folder); extra lines go under
# `config:`. Written as docs/formula.md says: 0640 root:salt.
formula_pillar() {
    local peers=() extra=() peer
    while [ $# -gt 0 ] && [ "$1" != -- ]; do peers+=("$1"); shift; done
    [ $# -gt 0 ] && shift && extra=("$@")
    {
        cat <<EOF
salt_keysync:
  pkg:
    source: $formula_source
  config:
    node: master-a
    listen: "$A_IP:4515"
EOF
        local line
        for line in "${extra[@]}"; do printf '    %s\n' "$line"; done
        echo "    peer:"
        for peer in "${peers[@]}"; do
            local var="${peer//-/_}_address"
            printf '      - name: %s\n        address: "%s"\n' "$peer" "${!var}"
        done
    } | inside sh -euc 'umask 077
        cat >/srv/pillar/salt_keysync.sls
        chgrp salt /srv/pillar/salt_keysync.sls
        chmod 0640 /srv/pillar/salt_keysync.sls'
}

# formula_apply NAME SLS: state.apply SLS from the container's salt-master
# to its minion master-a, JSON in $work/salt-NAME.json; salt's exit status
# (1 when a state failed or nothing rendered; not with --static, which
# loses the minion's exit status). Bounded: a minion that does not answer
# ends it after 5 minutes.
formula_apply() {
    inside timeout 300 salt master-a state.apply "$2" --out=json --timeout 60 \
        >"$work/salt-$1.json" 2>"$work/salt-$1.err"
}

# formula_apply_local NAME SLS: the same masterless (salt-call --local, the
# pillar rendered by root on the minion from its own /srv/pillar).
formula_apply_local() {
    inside timeout 300 salt-call --local state.apply "$2" --out=json >"$work/salt-$1.json" 2>"$work/salt-$1.err"
}

# formula_states NAME: the states of that run in their order, one line
# each: "ID RESULT changed|same" (RESULT True, False or None).
formula_states() {
    python3 - "$work/salt-$1.json" <<'EOF'
import json, sys
# salt-call --local: {"local": ...}; salt: {"master-a": ...}.
(ret,) = json.load(open(sys.argv[1])).values()
if not isinstance(ret, dict):
    sys.exit(f"no states ran: {ret}")
for key, state in sorted(ret.items(), key=lambda item: item[1]["__run_num__"]):
    print(state["__id__"], state["result"], "changed" if state["changes"] else "same")
EOF
}

# formula_state NAME ID: that state's line, "" if it did not run.
formula_state() { formula_states "$1" | awk -v id="$2" '$1 == id { print $2, $3 }'; }

# formula_stdout NAME ID: what that state's command printed.
formula_stdout() {
    python3 - "$work/salt-$1.json" "$2" <<'EOF'
import json, sys
(ret,) = json.load(open(sys.argv[1])).values()
for state in ret.values():
    if state["__id__"] == sys.argv[2]:
        print(state["changes"].get("stdout", ""), state["changes"].get("stderr", ""), state["comment"], sep="\n")
EOF
}

# expect_states NAME ID=RESULT...: each named state ran with that result
# and change ("True changed", "False same", ...); "absent" if it must not run.
expect_states() {
    local name=$1 pair id want got
    shift
    for pair in "$@"; do
        id=${pair%%=*} want=${pair#*=}
        got=$(formula_state "$name" "salt-keysync-$id")
        [ "${got:-absent}" = "$want" ] \
            || fail "state.apply ($name): salt-keysync-$id is '${got:-absent}', not '$want' (states: $(formula_states "$name" | tr '\n' ';'))"
    done
}

# The certificate master-a's agent presents to a new connection, as sha256
# of its DER; and that of a PEM file.
served_cert() {
    python3 - "$work/tls/ca.pem" "$work/tls/master-b.pem" "$work/tls/master-b.key" "$A_IP" <<'EOF'
import hashlib, socket, ssl, sys
ca, cert, key, host = sys.argv[1:]
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.load_verify_locations(ca)
context.load_cert_chain(cert, key)
context.set_alpn_protocols(["h2"])
with socket.create_connection((host, 4515), timeout=5) as raw:
    with context.wrap_socket(raw, server_hostname="master-a") as tls:
        print(hashlib.sha256(tls.getpeercert(binary_form=True)).hexdigest())
EOF
}
pem_cert_sha() {
    python3 -c 'import hashlib, ssl, sys; print(hashlib.sha256(ssl.PEM_cert_to_DER_cert(open(sys.argv[1]).read())).hexdigest())' "$1"
}

peer_absent() { [ "$(peer_state "$1")" = absent ]; }

metrics_answer() {
    python3 -c 'import sys, urllib.request; body = urllib.request.urlopen(sys.argv[1], timeout=3).read().decode(); sys.exit(0 if "keysync_build_info" in body else 1)' \
        "http://$A_IP:9515/metrics"
}

# formula_minion: a salt-minion in the container, id master-a, whose master
# is the container's salt-master (user: salt), run by Salt's own unit
# (pkg/common/salt-minion.service); its key accepted with salt-key there,
# and answering test.ping from the master.
formula_minion() {
    inside sh -euc "
        mkdir -p /etc/salt/minion.d
        cat >/etc/salt/minion.d/test-master.conf <<EOF
id: master-a
master: $A_IP
# A pending key's authentication retried every second, not every ten.
acceptance_wait_time: 1
EOF
        cat >/etc/systemd/system/salt-minion.service <<EOF
[Unit]
Description=The Salt Minion
After=network.target salt-master.service

[Service]
KillMode=process
Type=notify
NotifyAccess=all
LimitNOFILE=8192
ExecStart=/usr/bin/salt-minion

[Install]
WantedBy=multi-user.target
EOF
        systemctl daemon-reload
        systemctl start salt-minion
    " >"$work/salt-minion-setup.out" 2>&1 || fail "salt-minion did not start: $(tail -n 20 "$work/salt-minion-setup.out")"
    eventually 60 "the minion master-a's key pending on the container's salt-master" inside test -e "$PKI/minions_pre/master-a"
    salt_key_in_a -a master-a
    eventually 90 "the minion master-a answers its salt-master" minion_answers
    ok "salt-minion master-a: key accepted with salt-key, answers test.ping from the salt-master (user: salt)"
}

minion_answers() {
    local said
    said=$(inside timeout 30 salt master-a test.ping --out=json --static --timeout 10 2>&1) || { echo "$said"; return 1; }
    [ "$(printf '%s' "$said" | tr -d ' \n')" = '{"master-a":true}' ] || { echo "$said"; return 1; }
}

phase_formula() {
    step "the Salt formula on a fresh master, from its salt-master: salt master-a state.apply salt_keysync"
    run_doc_block purge
    inside rm -rf /etc/salt-keysync
    [ "$(inside dpkg-query -W -f '${Status}' salt-keysync 2>/dev/null)" != "install ok installed" ] || fail "still installed after the purge"
    # The formula as the package ships it, the pillar as the docs write it.
    run_doc_block formula-get
    # What the package ships is what this checkout holds: a .deb built
    # before the formula changed would test the old one.
    diff -r "$repo/packaging/salt-formula" "$(in_root /srv/formulas)" >"$work/formula-diff.out" 2>&1 \
        || fail "the formula in $(basename "$deb") differs from packaging/salt-formula (run scripts/package.sh): $(head -n 20 "$work/formula-diff.out")"
    ok "the .deb's formula, taken out as the docs say, is packaging/salt-formula"
    run_doc_block formula-roots
    run_doc_block formula-roots-master
    [ "$(inside systemctl is-active salt-master)" = active ] || fail "salt-master is not active after its restart"
    formula_minion
    formula_source="/srv/keysync/$(basename "$deb")"
    run_doc_block formula-pillar-dir
    formula_pillar master-b master-c
    run_doc_block formula-pillar-tls
    run_doc_block formula-pillar-top
    local modes
    modes=$(inside stat -c '%n %a %U:%G' /srv/pillar /srv/pillar/salt_keysync.sls /srv/pillar/salt_keysync_tls.sls /srv/pillar/top.sls)
    [ "$modes" = "/srv/pillar 750 root:salt
/srv/pillar/salt_keysync.sls 640 root:salt
/srv/pillar/salt_keysync_tls.sls 640 root:salt
/srv/pillar/top.sls 640 root:salt" ] || fail "the pillar files: $modes"
    if inside runuser -u nobody -- cat /srv/pillar/salt_keysync_tls.sls >/dev/null 2>&1; then
        fail "another user reads the TLS pillar"
    fi
    run_doc_block formula-pillar-look
    [ "$(head -n 1 "$work/doc-formula-pillar-look.out")" = "['config', 'pkg', 'tls']" ] \
        && grep -qx salt_keysync_tls.sls "$work/doc-formula-pillar-look.out" \
        || fail "the pillar as the salt-master renders it and as salt sees it: $(cat "$work/doc-formula-pillar-look.out")"
    ok "the pillar 0750/0640 root:salt: the salt-master (user salt) renders config, pkg and tls for master-a; other users read nothing"

    # The pillar folder as `umask 077; mkdir -p` made it (the recipe before):
    # the salt-master cannot enter it and renders an empty pillar, without
    # an error of its own. The formula says so, not something about
    # certificates, and changes nothing.
    local said
    inside chmod 0700 /srv/pillar
    if formula_apply pillar-hidden salt_keysync; then
        fail "state.apply succeeded with a pillar folder the salt-master cannot enter"
    fi
    said=$(cat "$work/salt-pillar-hidden.json")
    [[ "$said" == *"pillar salt_keysync is empty for minion master-a"* && "$said" == *"salt-call pillar.get salt_keysync:config"* \
        && "$said" == *"cannot enter the pillar folder"* && "$said" != *PEM* ]] \
        || fail "an empty pillar from the salt-master: $said"
    [ "$(inside dpkg-query -W -f '${Status}' salt-keysync 2>/dev/null)" != "install ok installed" ] || fail "an empty pillar installed the package"
    ok "a pillar folder the salt-master cannot enter: the formula stops, says the pillar is empty and how to look, installs nothing"
    # A file it cannot read in a folder it enters: Salt itself fails the pillar.
    inside chmod 0750 /srv/pillar
    inside chmod 0600 /srv/pillar/salt_keysync_tls.sls
    if formula_apply pillar-unreadable salt_keysync; then
        fail "state.apply succeeded with a pillar file the salt-master cannot read"
    fi
    said=$(cat "$work/salt-pillar-unreadable.json")
    [[ "$said" == *"Pillar failed to render"* ]] || fail "a pillar file the salt-master cannot read: $said"
    inside grep -q "Permission denied: '/srv/pillar/salt_keysync_tls.sls'" /var/log/salt/master \
        || fail "the master's log does not say Permission denied: $(inside tail -n 5 /var/log/salt/master)"
    inside chmod 0640 /srv/pillar/salt_keysync_tls.sls
    ok "a pillar file the salt-master cannot read: Pillar failed to render, Permission denied in the master's log"

    local keyline
    keyline=$(sed -n 2p "$share/master-a.key")

    run_doc_block formula-apply
    grep -q "all checks passed" "$work/doc-formula-apply.out" || fail "the first apply did not run salt-keysync check: $(tail -n 40 "$work/doc-formula-apply.out")"
    local order
    order=$(awk '$1 == "ID:" && ($2 ~ /cmd-check$/ || $2 ~ /service-running-service-running$/) { printf "%s ", $2 }' "$work/doc-formula-apply.out")
    [ "$order" = "salt-keysync-service-running-cmd-check salt-keysync-service-running-service-running " ] \
        || fail "the first apply's check and start, in this order: $order"
    [ "$(inside dpkg-query -W -f '${Status} ${Version}' salt-keysync)" = "install ok installed $version" ] \
        || fail "the formula did not install $(basename "$deb"): $(inside dpkg-query -W -f '${Status} ${Version}' salt-keysync 2>&1)"
    [ "$(inside systemctl is-active salt-keysync)" = active ] && [ "$(inside systemctl is-enabled salt-keysync)" = enabled ] \
        || fail "after the formula: $(inside systemctl is-active salt-keysync), $(inside systemctl is-enabled salt-keysync)"
    modes=$(inside stat -c '%n %a %U:%G' /etc/salt-keysync/config.toml /etc/salt-keysync/tls \
        /etc/salt-keysync/tls/ca.pem /etc/salt-keysync/tls/node.pem /etc/salt-keysync/tls/node.key)
    [ "$modes" = "/etc/salt-keysync/config.toml 640 root:salt
/etc/salt-keysync/tls 750 root:salt
/etc/salt-keysync/tls/ca.pem 644 root:root
/etc/salt-keysync/tls/node.pem 644 root:root
/etc/salt-keysync/tls/node.key 600 salt:salt" ] || fail "the formula's files: $modes"
    inside cmp -s /srv/keysync/master-a.key /etc/salt-keysync/tls/node.key || fail "node.key is not the pillar's key"
    ok "installed from the .deb, check passed, enabled and active; config 0640 root:salt, key 0600 salt:salt"
    if grep -rlF -- "$keyline" "$work/doc-formula-apply.out"; then
        fail "the private key is in salt's output"
    fi
    if inside grep -rlF -- "$keyline" /var/cache/salt/minion /var/cache/salt/master/jobs /var/log/salt; then
        fail "the private key is in the minion's cache, the master's job cache or a log (above)"
    fi
    ok "the private key is in neither salt's output, the master's job cache, nor the minion's cache and log"
    inside salt-keysync status >"$work/formula-status.out" 2>&1 || fail "salt-keysync status: $(cat "$work/formula-status.out")"
    eventually 30 "master-b up after the formula's start" expect_peer_state master-b up
    eventually 30 "master-c up after the formula's start" expect_peer_state master-c up
    # master-b pushes its decisions on its own link to master-a, which may
    # still wait out its reconnect backoff (up to 30 s) after master-a's
    # agent was purged and installed again (seen in CI: web9 not there in 15 s).
    eventually 45 "master-b's own link to the formula's master-a up" expect_outside_peer_state master-b master-a up
    pending_on_both web9
    salt_key_on master-b -a web9
    eventually 15 "web9 accepted on master-b reaches the formula's master-a" expect_folder master-a "$(in_root $PKI)" web9 minions
    salt_key_in_a -r web9 --include-accepted
    eventually 15 "web9 rejected on master-a reaches master-b" expect_folder master-b "$work/master-b/pki" web9 minions_rejected
    ok "salt-keysync status: both peers up; replicates both ways"

    run_doc_block formula-unchanged
    grep -qx "master-a: 0 changes, 0 failed" "$work/doc-formula-unchanged.out" || fail "a second apply: $(tail -n 5 "$work/doc-formula-unchanged.out")"
    ok "a second apply changes nothing"

    # A new build rolls out: pkg:source names the next revision (a higher
    # version, so pkg.installed installs it); the package's install script
    # restarts the agent, the formula's config stays as it wrote it.
    # Masterless, the other way docs/formula.md gives: salt-call --local
    # renders the same pillar on the minion, as root.
    local pid config_sha upgrade_deb
    pid=$(unit_prop MainPID)
    config_sha=$(inside sha256sum /etc/salt-keysync/config.toml)
    upgrade_deb=$(cd "$share/upgrade" && echo salt-keysync_*_amd64.deb)
    formula_source="/srv/keysync/upgrade/$upgrade_deb"
    formula_pillar master-b master-c
    formula_apply_local upgrade salt_keysync || fail "state.apply with a new build: $(formula_states upgrade 2>&1 | tr '\n' ';') $(tail -n 5 "$work/salt-upgrade.err")"
    expect_states upgrade package-install-pkg-installed="True changed" config-file-file-managed="True same" \
        service-running-cmd-check=absent service-running-service-running="True same"
    [ "$(inside dpkg-query -W -f '${Version}' salt-keysync)" = "${version%-*}-99" ] \
        || fail "the formula did not upgrade to $upgrade_deb: $(inside dpkg-query -W -f '${Version}' salt-keysync)"
    [ "$(inside sha256sum /etc/salt-keysync/config.toml)" = "$config_sha" ] || fail "the upgrade changed the formula's config"
    eventually 30 "the upgraded agent runs" restarted_as "$(unit_prop NRestarts)" "$pid"
    eventually 30 "master-b up after the formula's upgrade" expect_peer_state master-b up
    ok "a new build from pkg:source, masterless: upgraded to ${version%-*}-99 and restarted, the config unchanged"

    pid=$(unit_prop MainPID)
    formula_pillar master-b
    formula_apply peer-removed salt_keysync || fail "state.apply with master-c removed: $(formula_states peer-removed 2>&1 | tr '\n' ';') $(tail -n 5 "$work/salt-peer-removed.err")"
    expect_states peer-removed config-file-file-managed="True changed" service-running-cmd-check="True changed" \
        service-running-cmd-reload="True changed" service-running-service-running="True same"
    # (Each output in a variable first: with pipefail, `grep -q` ending a
    # pipe early would fail the writer with SIGPIPE.)
    said=$(formula_stdout peer-removed salt-keysync-service-running-cmd-reload)
    [[ "$said" == *"-master-c"* ]] || fail "the reload does not say master-c left: $said"
    [ "$(unit_prop MainPID)" = "$pid" ] || fail "a peer change restarted the agent"
    eventually 10 "master-c gone from master-a's status after the reload" peer_absent master-c
    ok "a peer removed: checked, then reloaded (same process): ${said%%$'\n'*}"

    # A renewed certificate (new key too), master-c back: a reload as well.
    mkdir -p "$work/tls2" "$share/tls2"
    cp "$work/tls/ca.pem" "$work/tls/ca.key" "$work/tls2/"
    "$bin" certs issue master-a --dir "$work/tls2" --days 400 >/dev/null
    cp "$work/tls2/ca.pem" "$work/tls2/master-a.pem" "$work/tls2/master-a.key" "$share/tls2/"
    chmod -R a+rX "$share/tls2"
    [ "$(served_cert)" = "$(pem_cert_sha "$work/tls/master-a.pem")" ] || fail "master-a does not serve its first certificate"
    run_doc_block formula-pillar-tls tls2
    formula_pillar master-b master-c
    formula_apply renewed salt_keysync || fail "state.apply with a renewed certificate: $(formula_states renewed 2>&1 | tr '\n' ';')"
    expect_states renewed config-file-tls-cert="True changed" config-file-tls-key="True changed" config-file-tls-ca="True same" \
        service-running-cmd-check="True changed" service-running-cmd-reload="True changed" service-running-service-running="True same"
    [ "$(unit_prop MainPID)" = "$pid" ] || fail "a certificate change restarted the agent"
    [ "$(served_cert)" = "$(pem_cert_sha "$work/tls2/master-a.pem")" ] || fail "after the reload master-a does not serve its renewed certificate"
    if grep -F -- "$(sed -n 2p "$share/tls2/master-a.key")" "$work/salt-renewed.json" >/dev/null; then
        fail "the renewed key is in salt's output"
    fi
    eventually 30 "master-c up again after the reload" expect_peer_state master-c up
    ok "a renewed certificate and master-c back: reloaded (same process), the new certificate served, no diff of the key"

    # A restart-only key, while check fails for a cause outside the
    # formula's files: nothing touched; once fixed, the same pillar restarts.
    formula_pillar master-b master-c -- "metrics_listen: \"$A_IP:9515\""
    inside chmod 0755 /var/lib/salt-keysync
    if formula_apply check-fails salt_keysync; then
        fail "state.apply succeeded although salt-keysync check fails"
    fi
    expect_states check-fails config-file-file-managed="True changed" service-running-cmd-check="False changed" \
        service-running-service-running="False same" service-running-cmd-reload=absent service-running-file-applied="False same"
    said=$(formula_stdout check-fails salt-keysync-service-running-cmd-check)
    grep -q "^FAIL.*/var/lib/salt-keysync" <<<"$said" || fail "check's output does not name the state folder: $said"
    [ "$(unit_prop MainPID)" = "$pid" ] && [ "$(inside systemctl is-active salt-keysync)" = active ] \
        || fail "a failing check did not leave the agent alone"
    ! metrics_answer 2>/dev/null || fail "metrics answer although the agent was not restarted"
    ok "check fails: the state fails with check's FAIL line, the agent runs on untouched"
    inside chmod 0700 /var/lib/salt-keysync
    formula_apply restart salt_keysync || fail "state.apply after the fix: $(formula_states restart 2>&1 | tr '\n' ';')"
    expect_states restart config-file-file-managed="True same" service-running-cmd-check="True changed" \
        service-running-service-running="True changed" service-running-cmd-reload=absent service-running-file-applied="True changed"
    said=$(formula_states restart | awk '/cmd-check|service-running-service-running/ && !seen++ { print $1 }')
    [ "$said" = salt-keysync-service-running-cmd-check ] || fail "the restart ran before the check"
    [ "$(unit_prop MainPID)" != "$pid" ] && [ "$(inside systemctl is-active salt-keysync)" = active ] || fail "no restart"
    eventually 10 "metrics_listen in force: /metrics answers" metrics_answer
    eventually 30 "master-b up after the restart" expect_peer_state master-b up
    ok "the same pillar once check passes: checked, then restarted; metrics_listen in force"

    local keys_before
    keys_before=$(inside sh -c "cd $PKI && ls minions minions_pre minions_rejected")
    run_doc_block formula-clean
    [ "$(inside systemctl is-active salt-keysync)" != active ] || fail "the agent runs after salt_keysync.clean"
    [ "$(inside dpkg-query -W -f '${Status}' salt-keysync)" = "deinstall ok config-files" ] \
        || fail "after salt_keysync.clean the package is '$(inside dpkg-query -W -f '${Status}' salt-keysync)'"
    local path
    for path in /etc/salt-keysync/config.toml /etc/salt-keysync/tls /var/cache/salt/minion/salt_keysync/applied; do
        [ ! -e "$(in_root $path)" ] || fail "salt_keysync.clean left $path"
    done
    [ -e "$(in_root /var/lib/salt-keysync/state.redb)" ] || fail "salt_keysync.clean removed the state"
    [ "$(inside sh -c "cd $PKI && ls minions minions_pre minions_rejected")" = "$keys_before" ] || fail "salt_keysync.clean changed the keys"
    [ "$(inside systemctl is-active salt-master)" = active ] || fail "salt-master stopped with salt_keysync.clean"
    ok "salt_keysync.clean: agent stopped, package removed, config and TLS gone; state, keys and salt-master kept"
}
