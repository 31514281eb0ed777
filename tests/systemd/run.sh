#!/usr/bin/env bash
# The .deb under a real systemd, beside a real salt-master that runs as salt:
#
#     tests/systemd/run.sh        # as root, after ./scripts/package.sh
#
# Boots a minimal Debian bookworm (tests/systemd/image.sh, cached under
# target/systemd-image/) with systemd-nspawn, runs Salt 3008.3's salt-master
# in it as a service with `user: salt`, installs target/debian/*.deb with the
# commands docs/operations.md gives (run verbatim from there), and checks
# the agent under the packaged unit, unchanged, against two agents outside
# the container (nspawn shares the host's loopback): real salt-key on both
# sides, .dfn, reload, restart, kill -9, status, journal priorities, the
# watchdog, log rotation, a lost state, upgrade, remove, purge, reinstall;
# first of all a rolling upgrade of a three-master site from the previous
# release (rolling.sh; tests/upgrade/build.sh builds that release from its
# commit in git once, cached under target/previous-release/), timing each
# decision between old and upgraded masters; then the Salt formula on the purged master (formula.sh): the
# container's salt-master applies it to a salt-minion beside it (state.apply installs, configures and starts
# it, reloads, restarts, cleans; one upgrade masterless, salt-call --local), with the pillar it can read.
# Ends with one line: "systemd-test: PASS (...)" or "systemd-test: FAIL: ...".
# Fails (never skips) when something it needs is missing;
# scripts/deps.sh installs it. KEEP=1 keeps the work folder;
# HOLD=1 keeps the container running after a failure, for a look inside.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
# shellcheck source=tests/systemd/lib.sh
source "$here/lib.sh"
# master-a is the container; master-b and master-c run outside it. Own
# loopback addresses, so nothing else on the machine holds their ports.
A_IP=127.0.18.1
B_ADDR=127.0.18.2:4515
C_ADDR=127.0.18.3:4515
SALT_VERSION=3008.3
# shellcheck source=tests/systemd/phases.sh
source "$here/phases.sh"
# shellcheck source=tests/systemd/formula.sh
source "$here/formula.sh"
# shellcheck source=tests/systemd/rolling.sh
source "$here/rolling.sh"
# shellcheck source=tests/systemd/downgrade.sh
source "$here/downgrade.sh"

[ "$(id -u)" -eq 0 ] || fail "must run as root (systemd-nspawn, mmdebstrap, nsenter)"
missing=()
for tool in systemd-nspawn mmdebstrap unshare nsenter setsid pgrep dpkg-deb python3 flock; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
[ ${#missing[@]} -eq 0 ] || fail "missing ${missing[*]}: run scripts/deps.sh as root (apt-get install systemd-container mmdebstrap)"
shopt -s nullglob
debs=("$target"/debian/*.deb)
[ ${#debs[@]} -eq 1 ] || fail "expected one .deb in $target/debian, found ${#debs[@]}: run scripts/package.sh"
deb=${debs[0]}
bin="$target/release/salt-keysync"
version=$(dpkg-deb -f "$deb" Version)
[ -x "$bin" ] && [[ "$("$bin" --version)" == "salt-keysync ${version%-*} (protocol "* ]] \
    || fail "$bin is missing or not the .deb's version ${version%-*}: run scripts/package.sh"

# The previous release, from its commit (minutes the first time, then cached).
step "the previous release, built from git"
prev=$("$repo/tests/upgrade/build.sh") || fail "tests/upgrade/build.sh could not build the previous release"
read -r prev_version prev_commit prev_deb prev_bin <<<"$prev"
prev_protocol=$(sed -n 's/^protocol=//p' "$repo/tests/upgrade/previous-release")
[ -n "$prev_protocol" ] || fail "tests/upgrade/previous-release names no protocol"
ok "$prev_version ($prev_commit): $(basename "$prev_deb")"

# One run at a time on this machine: the addresses above and nspawn's
# cgroups are shared.
exec {lock}>/tmp/salt-keysync-systemd-test.lock
flock -w 900 "$lock" || fail "another tests/systemd/run.sh held its lock for 15 minutes"

work=$(mktemp -d "$target/systemd-test.XXXXXX")
cleanup() {
    local status=$?
    if [ "$status" -ne 0 ] && [ -n "${HOLD:-}" ] && [ -n "${leader:-}" ]; then
        # For a look inside: nsenter --target <leader> --all; ends on SIGTERM.
        echo "systemd-test: HOLD: container leader $leader, test pid $$; kill $$ to end" >&2
        trap 'kill "$hold" 2>/dev/null' TERM
        sleep infinity {lock}>&- &
        hold=$!
        wait "$hold" || true
    fi
    peer_stop master-b
    peer_stop master-c
    shutdown_container
    if [ "$status" -eq 0 ] && [ -z "${KEEP:-}" ]; then
        rm -rf "$work"
    else
        echo "systemd-test: work folder kept: $work" >&2
    fi
}
trap cleanup EXIT

step "Salt $SALT_VERSION for the masters outside, the container's tree"
salt_venv=$("$repo/tests/salt/venv.sh" "$SALT_VERSION" | awk '{print $2}')
rootfs=$("$here/image.sh") || fail "tests/systemd/image.sh could not make the tree"
ok "tree $rootfs"

step "certificates, minion keys, the packages, in the folder the container sees"
share="$work/share"
mkdir -p "$share/keys" "$share/upgrade" "$share/previous"
"$bin" certs init --dir "$work/tls" >/dev/null
for name in master-a master-b master-c; do
    "$bin" certs issue "$name" --dir "$work/tls" >/dev/null
done
cp "$work/tls/ca.pem" "$work/tls/master-a.pem" "$work/tls/master-a.key" "$share/"
cp "$deb" "$share/"
cp "$prev_deb" "$share/previous/"
"$salt_venv/bin/python" "$repo/tests/salt/gen-keys.py" "$share/keys" web 10 >/dev/null
"$salt_venv/bin/python" "$repo/tests/salt/gen-keys.py" "$share/keys" roll 28 >/dev/null
# The same package one Debian revision later, for the upgrade; its example
# config changed, as a release's does.
dpkg-deb --raw-extract "$deb" "$work/repack"
sed -i "s/^Version: .*/Version: ${version%-*}-99/" "$work/repack/DEBIAN/control"
echo "# (changed in revision 99)" >>"$work/repack/usr/share/salt-keysync/config.toml"
dpkg-deb --build "$work/repack" "$share/upgrade/" >/dev/null
chmod -R a+rX "$share"
ok "certificates for master-a, -b, -c; 38 minion keys; $(basename "$deb"), its -99 revision and $(basename "$prev_deb")"

step "boot the container"
boot "$rootfs" "$share"
ok "systemd $(inside systemctl --version | head -n 1 | awk '{print $2}') runs in the container"

phase_salt_master
phase_rolling_upgrade
phase_install
phase_unit
phase_replication
phase_status_and_journal
phase_reload
phase_restart_and_kill
phase_logrotate_and_watchdog
phase_state_lost
phase_upgrade
phase_downgrade
phase_remove_purge_reinstall
phase_formula
phase_key_modes

printf 'systemd-test: PASS (%d checks, %d s)\n' "$n_checks" $((SECONDS - started_at))
