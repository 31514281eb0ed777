# shellcheck shell=bash
# A downgrade and back, under systemd (issue 29 item 5), sourced by
# tests/systemd/run.sh after phase_upgrade: master-a runs this release as
# salt with a state store of format 2.
#
# 1. apt-get install --allow-downgrades of a build that reads format 1 only
#    (this package with the scripts such a release would have) is refused
#    before anything is replaced, naming the releases and the way out, and
#    the agent runs on untouched.
# 2. The real 0.1.0 package (its scripts have no such check) is not
#    stopped: the refusal is printed and dpkg goes on; without a terminal it
#    then stops at 0.1.0's conffile question (apt-get exits 100, 0.1.0
#    unpacked, this release's agent still running); configured (keeping
#    the config), 0.1.0's agent runs as root and calls the store corrupt
#    at every start.
# 3. 0.1.0's `recover --from-peers --force`, from a root shell as its
#    message advises, leaves the store (0644) and the marker root's in the
#    folders of salt; 0.1.0's agent then runs.
# 4. This release again, without a terminal: the package hands root's files
#    back, the agent starts as salt, narrows the store to 0600, replicates.
# 5. An upgrade whose restarted agent exits 78 fails (apt-get exits 100,
#    the journal's cause quoted); once fixed, dpkg --configure -a ends it.

# What 0.1.0's agent said last about the store (it logs without priorities).
said_corrupt() { inside journalctl --no-pager -u salt-keysync -o cat | grep 'is corrupt' | tail -n 1 | grep .; }

phase_downgrade() {
    step "downgrades: below the store's format refused, to 0.1.0 not stopped, and back"
    local pkg pid out
    pkg=$(basename "$deb")
    pid=$(unit_prop MainPID)
    inside grep -qx "format 2" /var/lib/salt-keysync/state.format \
        || fail "state.format: $(inside cat /var/lib/salt-keysync/state.format 2>&1)"
    [ "$(inside stat -c '%a %U' /var/lib/salt-keysync/state.format)" = "600 salt" ] \
        || fail "state.format: $(inside stat -c '%a %U' /var/lib/salt-keysync/state.format)"

    inside sh -ec "rm -rf /tmp/older; dpkg-deb --raw-extract ./$pkg /tmp/older
        sed -i 's/^Version: .*/Version: 0.1.9-1/' /tmp/older/DEBIAN/control
        sed -i 's/^reads=.*/reads=1/' /tmp/older/DEBIAN/preinst /tmp/older/DEBIAN/prerm
        dpkg-deb --build /tmp/older /tmp/salt-keysync_0.1.9-1_amd64.deb >/dev/null"
    out="$work/downgrade-refused.out"
    if inside --no-terminal apt-get install -y --allow-downgrades /tmp/salt-keysync_0.1.9-1_amd64.deb </dev/null >"$out" 2>&1; then
        fail "apt-get install --allow-downgrades of a build reading format 1 succeeded: $(tail -n 5 "$out")"
    fi
    local said
    for said in "refusing to downgrade to salt-keysync 0.1.9-1" "format 2 (written by salt-keysync ${version%-*})" \
        "recover --from-peers" "Nothing was changed"; do
        grep -qF -- "$said" "$out" || fail "the refused downgrade does not say '$said': $(cat "$out")"
    done
    [ "$(inside dpkg-query -W -f '${Status} ${Version}' salt-keysync)" = "install ok installed ${version%-*}-99" ] \
        || fail "after the refused downgrade: $(inside dpkg-query -W -f '${Status} ${Version}' salt-keysync)"
    [ "$(inside systemctl is-active salt-keysync)" = active ] && [ "$(unit_prop MainPID)" = "$pid" ] \
        || fail "the refused downgrade stopped or restarted the agent"
    ok "apt-get install --allow-downgrades of a build reading format 1: refused before anything was replaced, the agent untouched"

    # 0.1.0 ships the config as a conffile: without a terminal dpkg stops
    # at its question, with 0.1.0 unpacked (its binary in place) and not
    # configured; the agent of this release runs on until restarted.
    out="$work/downgrade-010.out"
    if inside --no-terminal apt-get install -y --allow-downgrades "./previous/$(basename "$prev_deb")" </dev/null \
        >"$out" 2>&1; then
        fail "apt-get install --allow-downgrades of 0.1.0 without a terminal did not stop at its conffile question"
    fi
    grep -qF "refusing to downgrade to salt-keysync $prev_version-1" "$out" || fail "no refusal printed: $(cat "$out")"
    grep -qF "end of file on stdin at conffile prompt" "$out" || fail "0.1.0's install failed otherwise: $(tail -n 5 "$out")"
    [ "$(inside dpkg-query -W -f '${Version} ${db:Status-Abbrev}' salt-keysync)" = "$prev_version-1 iU " ] \
        || fail "0.1.0 after the conffile question: $(inside dpkg-query -W -f '${Version} ${db:Status-Abbrev}' salt-keysync)"
    [ "$(inside systemctl is-active salt-keysync)" = active ] && [ "$(unit_prop MainPID)" = "$pid" ] \
        || fail "the agent did not run on"
    ok "0.1.0 without a terminal: unpacked over this release, stopped at its conffile question (apt-get exit 100), the agent runs on"
    inside --no-terminal dpkg --configure -a --force-confold </dev/null >>"$out" 2>&1 \
        || fail "dpkg --configure -a --force-confold of 0.1.0: $(tail -n 5 "$out")"
    [ "$(inside dpkg-query -W -f '${Version} ${db:Status-Abbrev}' salt-keysync)" = "$prev_version-1 ii " ] \
        || fail "0.1.0 is not installed"
    eventually 30 "0.1.0's agent says why it cannot start" said_corrupt
    [ "$(inside systemctl is-active salt-keysync)" != active ] || fail "0.1.0's agent runs on 0.2.0's store"
    ok "0.1.0 configured (dpkg --configure -a --force-confold): its agent as root says: $(said_corrupt)"

    inside systemctl stop salt-keysync
    inside systemctl reset-failed salt-keysync
    inside salt-keysync recover --from-peers --force >"$work/recover-010.out" 2>&1 \
        || fail "0.1.0's recover --force: $(cat "$work/recover-010.out")"
    inside systemctl start salt-keysync || fail "0.1.0's agent did not start on its recovered store"
    local left
    left=$(inside stat -c '%a %U' /var/lib/salt-keysync/state.redb "$PKI/.keysync-staging/.salt-keysync-state")
    [ "$left" = "644 root
600 root" ] || fail "0.1.0's recover as root left: $left"
    ok "0.1.0's recover --force (root shell): store 0644 root's, marker root's in salt's staging folder; its agent runs"

    out="$work/back-to-this.out"
    inside --no-terminal apt-get install -y "./$pkg" </dev/null >"$out" 2>&1 \
        || fail "apt-get install of this release over 0.1.0 failed: $(tail -n 8 "$out")"
    grep -q "handed over to salt" "$out" || fail "the package did not say it handed the marker over: $(cat "$out")"
    [ "$(inside systemctl is-active salt-keysync)" = active ] || fail "the agent is not active after coming back"
    [ "$(unit_prop User)" = salt ] || fail "User= after coming back: $(unit_prop User)"
    left=$(inside stat -c '%a %U' /var/lib/salt-keysync/state.redb "$PKI/.keysync-staging/.salt-keysync-state")
    [ "$left" = "600 salt
600 salt" ] || fail "after coming back: $left"
    inside salt-keysync check >"$work/check-back.out" 2>&1 || fail "check after coming back: $(cat "$work/check-back.out")"
    "$salt_venv/bin/python" "$repo/tests/salt/gen-keys.py" "$share/keys" down 1 >/dev/null
    chmod -R a+rX "$share/keys"
    pending_on_both down0
    salt_key_on master-b -a down0
    eventually 15 "down0 reaches master-a after coming back" expect_folder master-a "$(in_root $PKI)" down0 minions
    ok "back to ${version%-*}: root's marker handed over, the store 0600 salt's, check passes, replicating"

    # 5. An upgrade whose agent does not start again fails: apt-get exits
    #    100 with the cause; once fixed, dpkg --configure -a finishes it.
    # (The package sets the config's mode itself: the TLS key's it leaves.)
    inside chmod 0644 /etc/salt-keysync/tls/node.key
    out="$work/upgrade-not-started.out"
    if inside --no-terminal sh -c 'apt-get install -y ./upgrade/*.deb' </dev/null >"$out" 2>&1; then
        fail "an upgrade whose agent did not start again succeeded: $(tail -n 8 "$out")"
    fi
    for said in "did not start again" "too open" "dpkg --configure -a"; do
        grep -qF -- "$said" "$out" || fail "the failed upgrade does not say '$said': $(cat "$out")"
    done
    inside chmod 0600 /etc/salt-keysync/tls/node.key
    inside systemctl start salt-keysync || fail "the agent did not start once the config was fixed"
    inside --no-terminal dpkg --configure -a </dev/null >>"$out" 2>&1 || fail "dpkg --configure -a: $(tail -n 5 "$out")"
    [ "$(inside dpkg-query -W -f '${Version} ${db:Status-Abbrev}' salt-keysync)" = "${version%-*}-99 ii " ] \
        || fail "after dpkg --configure -a: $(inside dpkg-query -W -f '${Version} ${db:Status-Abbrev}' salt-keysync)"
    ok "an upgrade whose agent exits 78 fails (apt-get exit 100, the cause quoted); fixed, dpkg --configure -a finishes it"
}
