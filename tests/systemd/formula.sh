# The Salt formula (packaging/salt-formula, as the .deb ships it) applied
# with `salt-call --local` on master-a after a purge, as a fresh master
# (sourced by tests/systemd/run.sh, after phases.sh): the agent it starts
# replicates with master-b and master-c outside, a second run changes
# nothing, a peer or certificate change reloads, another key restarts, a
# failing `salt-keysync check` leaves the agent untouched until fixed, and
# salt_keysync.clean undoes it. The commands docs/formula.md marks run
# verbatim.

# formula_pillar PEER... [-- YAML-LINE...]: master-a's config pillar, the
# package $formula_source (from the shared folder); extra lines go under
# `config:`.
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
    } | inside sh -c 'umask 077 && mkdir -p /srv/pillar && cat >/srv/pillar/salt_keysync.sls'
}

# formula_apply NAME SLS: state.apply SLS in the container, JSON in
# $work/salt-NAME.json; salt-call's exit status.
formula_apply() {
    inside salt-call --local state.apply "$2" --out=json >"$work/salt-$1.json" 2>"$work/salt-$1.err"
}

# formula_states NAME: the states of that run in their order, one line
# each: "ID RESULT changed|same" (RESULT True, False or None).
formula_states() {
    python3 - "$work/salt-$1.json" <<'EOF'
import json, sys
ret = json.load(open(sys.argv[1]))["local"]
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
ret = json.load(open(sys.argv[1]))["local"]
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

phase_formula() {
    step "the Salt formula on a fresh master: salt-call --local state.apply salt_keysync"
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
    formula_source="/srv/keysync/$(basename "$deb")"
    formula_pillar master-b master-c
    inside sh -c "printf 'base:\n  \"*\":\n    - salt_keysync\n    - salt_keysync_tls\n' >/srv/pillar/top.sls"
    run_doc_block formula-pillar-tls
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
    local modes
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
        fail "the private key is in salt-call's output"
    fi
    if inside grep -rlF -- "$keyline" /var/cache/salt /var/log/salt; then
        fail "the private key is in the minion's cache or log (above)"
    fi
    ok "the private key is in neither salt-call's output nor the minion's cache and log"
    inside salt-keysync status >"$work/formula-status.out" 2>&1 || fail "salt-keysync status: $(cat "$work/formula-status.out")"
    eventually 30 "master-b up after the formula's start" expect_peer_state master-b up
    eventually 30 "master-c up after the formula's start" expect_peer_state master-c up
    pending_on_both web9
    salt_key_on master-b -a web9
    eventually 15 "web9 accepted on master-b reaches the formula's master-a" expect_folder master-a "$(in_root $PKI)" web9 minions
    salt_key_in_a -r web9 --include-accepted
    eventually 15 "web9 rejected on master-a reaches master-b" expect_folder master-b "$work/master-b/pki" web9 minions_rejected
    ok "salt-keysync status: both peers up; replicates both ways"

    run_doc_block formula-unchanged
    grep -qx "0 changes, 0 failed" "$work/doc-formula-unchanged.out" || fail "a second apply: $(tail -n 5 "$work/doc-formula-unchanged.out")"
    ok "a second apply changes nothing"

    # A new build rolls out: pkg:source names the next revision (a higher
    # version, so pkg.installed installs it); the package's install script
    # restarts the agent, the formula's config stays as it wrote it.
    local pid config_sha upgrade_deb
    pid=$(unit_prop MainPID)
    config_sha=$(inside sha256sum /etc/salt-keysync/config.toml)
    upgrade_deb=$(cd "$share/upgrade" && echo salt-keysync_*_amd64.deb)
    formula_source="/srv/keysync/upgrade/$upgrade_deb"
    formula_pillar master-b master-c
    formula_apply upgrade salt_keysync || fail "state.apply with a new build: $(formula_states upgrade 2>&1 | tr '\n' ';') $(tail -n 5 "$work/salt-upgrade.err")"
    expect_states upgrade package-install-pkg-installed="True changed" config-file-file-managed="True same" \
        service-running-cmd-check=absent service-running-service-running="True same"
    [ "$(inside dpkg-query -W -f '${Version}' salt-keysync)" = "${version%-*}-99" ] \
        || fail "the formula did not upgrade to $upgrade_deb: $(inside dpkg-query -W -f '${Version}' salt-keysync)"
    [ "$(inside sha256sum /etc/salt-keysync/config.toml)" = "$config_sha" ] || fail "the upgrade changed the formula's config"
    eventually 30 "the upgraded agent runs" restarted_as "$(unit_prop NRestarts)" "$pid"
    eventually 30 "master-b up after the formula's upgrade" expect_peer_state master-b up
    ok "a new build from pkg:source: upgraded to ${version%-*}-99 and restarted, the config unchanged"

    pid=$(unit_prop MainPID)
    formula_pillar master-b
    formula_apply peer-removed salt_keysync || fail "state.apply with master-c removed: $(formula_states peer-removed 2>&1 | tr '\n' ';') $(tail -n 5 "$work/salt-peer-removed.err")"
    expect_states peer-removed config-file-file-managed="True changed" service-running-cmd-check="True changed" \
        service-running-cmd-reload="True changed" service-running-service-running="True same"
    # (Each output in a variable first: with pipefail, `grep -q` ending a
    # pipe early would fail the writer with SIGPIPE.)
    local said
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
        fail "the renewed key is in salt-call's output"
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
