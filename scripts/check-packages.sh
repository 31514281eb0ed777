#!/usr/bin/env bash
# Checks the packages ./scripts/package.sh made: every expected file with its
# mode and kind, conffiles (the .deb's config is none), maintainer scripts,
# the version; then, where the machine allows (root, dpkg, no salt-keysync
# installed by someone else), installs the .deb, runs the binary, checks
# that the documents it names are there, `check`, `systemd-analyze verify`
# on the installed unit and its generator, removes and purges it, and checks
# that purge keeps the audit log unless SALT_KEYSYNC_PURGE_AUDIT=yes; last,
# upgrades to it without a terminal from a package laid out as 0.1.0 was
# (the config a conffile, edited, its example changed since), keeping the
# edit. The package under a real systemd beside a real salt-master is
# tests/systemd/run.sh.
#
# The .rpm is read with `rpm -qp` if rpm is installed, else by reading its
# header directly (a small parser below: lead, signature and main header;
# file names, modes, flags and scriptlets). Its install is not tested here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fail() { echo "check-packages: FAIL: $*" >&2; exit 1; }
shopt -s nullglob
debs=(target/debian/*.deb)
rpms=(target/generate-rpm/*.rpm)
[ ${#debs[@]} -eq 1 ] || fail "expected one .deb in target/debian (run ./scripts/package.sh), found ${#debs[@]}"
[ ${#rpms[@]} -eq 1 ] || fail "expected one .rpm in target/generate-rpm (run ./scripts/package.sh), found ${#rpms[@]}"
deb=${debs[0]} rpm=${rpms[0]}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
man_pages=(target/release/package-assets/man/*.1.gz)
[ ${#man_pages[@]} -ge 4 ] || fail "man pages missing under target/release/package-assets/man"

# "path mode" lines (mode in octal with the file type: 100xxx file, 40xxx
# folder), shared by both packages; then each package's own.
common=(
    "usr/bin/salt-keysync 100755"
    "usr/lib/systemd/system/salt-keysync.service 100644"
    "usr/lib/systemd/system-generators/salt-keysync-generator 100755"
    "usr/lib/salt-keysync/master-user 100755"
    "usr/lib/salt-keysync/owners 100755"
    "usr/share/salt-keysync/config.toml 100644"
    "etc/logrotate.d/salt-keysync 100644"
    "usr/share/bash-completion/completions/salt-keysync 100644"
    "usr/share/fish/vendor_completions.d/salt-keysync.fish 100644"
    "usr/share/doc/salt-keysync/operations.md 100644"
    "usr/share/doc/salt-keysync/recovery.md 100644"
    "usr/share/doc/salt-keysync/SECURITY.md 100644"
    "usr/share/doc/salt-keysync/README.md 100644"
    "usr/share/doc/salt-keysync/CHANGELOG.md 100644"
    "usr/share/doc/salt-keysync/monitoring.md 100644"
    "usr/share/doc/salt-keysync/monitoring-dashboard.png 100644"
    "usr/share/doc/salt-keysync/adopting.md 100644"
    "usr/share/doc/salt-keysync/performance.md 100644"
    "usr/share/doc/salt-keysync/ARCHITECTURE.md 100644"
    "usr/share/salt-keysync/monitoring/alerts.yml 100644"
    "usr/share/salt-keysync/monitoring/dashboard.json 100644"
)
for page in "${man_pages[@]}"; do common+=("usr/share/man/man1/$(basename "$page") 100644"); done
# The Salt formula, every file of packaging/salt-formula (docs/formula.md):
# a file added there but not to agent/Cargo.toml's assets fails here.
common+=("usr/share/doc/salt-keysync/formula.md 100644")
while IFS= read -r file; do
    common+=("usr/share/salt-keysync/salt-formula/${file#packaging/salt-formula/} 100644")
done < <(find packaging/salt-formula -type f | sort)
formula_version=$(sed -n 's/^version: //p' packaging/salt-formula/FORMULA)
[ "$formula_version" = "$version" ] || fail "packaging/salt-formula/FORMULA says version $formula_version, Cargo.toml $version"
deb_only=("usr/share/zsh/vendor-completions/_salt-keysync 100644")
# The .rpm ships the config as %config(noreplace), which never asks; the .deb
# only the example, which postinst copies when /etc has none (no conffile:
# dpkg would ask on upgrade).
rpm_only=("usr/share/zsh/site-functions/_salt-keysync 100644" "etc/salt-keysync/config.toml 100600")
# Neither tool ships empty folders: both packages' post-install scripts make
# the state and audit log folders, private and owned by the agent's user
# (packaging/owners).
private_dirs="/usr/lib/salt-keysync/owners"

# Asserts that every expected "path mode" line is in the listing file $1.
expect_all() {
    local listing=$1 what=$2
    shift 2
    for entry in "$@"; do
        grep -qxF "$entry" "$listing" || fail "$what: no \"$entry\" (have: $(grep -F "${entry%% *}" "$listing" || echo nothing))"
    done
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== $deb"
dpkg-deb -c "$deb"
# Exact modes from the data tarball, as "path mode" lines.
dpkg-deb --fsys-tarfile "$deb" | python3 -c '
import sys, tarfile
for m in tarfile.open(fileobj=sys.stdin.buffer, mode="r|"):
    kind = 0o40000 if m.isdir() else 0o100000 if m.isfile() else 0
    print(m.name.removeprefix("./").rstrip("/"), format(kind | m.mode, "o"))
' >"$work/deb.list"
expect_all "$work/deb.list" "$deb" "${common[@]}" "${deb_only[@]}"
dpkg-deb -e "$deb" "$work/control"
grep -qxF /etc/logrotate.d/salt-keysync "$work/control/conffiles" || fail "$deb: /etc/logrotate.d/salt-keysync is not a conffile"
if grep -F /etc/salt-keysync "$work/control/conffiles"; then
    fail "$deb: the config is a conffile: an upgrade over an edited one would stop at dpkg's question"
fi
grep -qF /usr/share/salt-keysync/config.toml "$work/control/postinst" || fail "$deb: postinst does not install the config from the example"
for script in preinst postinst prerm postrm; do
    [ -x "$work/control/$script" ] || fail "$deb: maintainer script $script missing or not executable"
    sh -n "$work/control/$script" || fail "$deb: $script is not valid sh"
done
grep -q SALT_KEYSYNC_PURGE_AUDIT "$work/control/postrm" || fail "$deb: postrm does not keep the audit log"
grep -qF "$private_dirs" "$work/control/postinst" || fail "$deb: postinst does not make the private folders"
grep -q "^Version: $version-1$" "$work/control/control" || fail "$deb: version is not $version-1"
echo "ok   .deb: ${#common[@]} common + ${#deb_only[@]} own files with their modes, conffiles (not the config), scripts"

echo "== $rpm"
if command -v rpm >/dev/null; then
    echo "(listed with rpm -qp)"
    rpm -K --nosignature "$rpm" || fail "$rpm: rpm -K finds it damaged"
    rpm -qp --qf '[%{FILENAMES} %{FILEMODES:octal}\n]' "$rpm" | sed 's|^/||' >"$work/rpm.list"
    rpm -qp --qf '[%{FILENAMES} %{FILEFLAGS:fflags}\n]' "$rpm" | sed 's|^/||' >"$work/rpm.flags"
    rpm -qp --scripts "$rpm" >"$work/rpm.scripts"
    rpm -qp --qf '%{VERSION}-%{RELEASE}\n' "$rpm" >"$work/rpm.version"
else
    echo "(rpm not installed: listed by reading the rpm header directly)"
    python3 - "$rpm" "$work" <<'PY'
# Reads an RPM v4 file's main header: lead (96 bytes), signature header
# (padded to 8 bytes), main header. Each header: magic 8eade801, 4 reserved
# bytes, index count, data size, 16-byte index entries, data.
import struct, sys
path, out = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
if data[:4] != b"\xed\xab\xee\xdb":
    sys.exit(f"{path}: not an RPM file (bad lead magic)")

def header(offset):
    if data[offset:offset + 4] != b"\x8e\xad\xe8\x01":
        sys.exit(f"{path}: bad header magic at {offset}")
    count, size = struct.unpack(">II", data[offset + 8:offset + 16])
    store = offset + 16 + 16 * count
    tags = {}
    for i in range(count):
        tag, kind, off, n = struct.unpack(">IIII", data[offset + 16 + 16 * i:offset + 32 + 16 * i])
        at = store + off
        if kind == 3:
            tags[tag] = list(struct.unpack(f">{n}H", data[at:at + 2 * n]))
        elif kind == 4:
            tags[tag] = list(struct.unpack(f">{n}I", data[at:at + 4 * n]))
        elif kind in (6, 8, 9):
            strings = data[at:].split(b"\0")[:n]
            tags[tag] = [s.decode() for s in strings]
    return tags, store + size

_, end = header(96)
tags, _ = header((end + 7) // 8 * 8)
names = [tags[1118][d] + b for d, b in zip(tags[1116], tags[1117])]  # DIRNAMES[DIRINDEXES] + BASENAMES
with open(f"{out}/rpm.list", "w") as f:
    for name, mode in zip(names, tags[1030]):  # FILEMODES
        print(name.lstrip("/"), format(mode, "o"), file=f)
flag_names = {1: "c", 2: "d", 16: "n", 8: "m"}  # config, doc, noreplace, missingok
with open(f"{out}/rpm.flags", "w") as f:
    for name, flags in zip(names, tags[1037]):  # FILEFLAGS
        print(name.lstrip("/"), "".join(c for bit, c in flag_names.items() if flags & bit), file=f)
with open(f"{out}/rpm.scripts", "w") as f:
    for tag, label in ((1023, "preinstall"), (1024, "postinstall"), (1025, "preuninstall"), (1026, "postuninstall")):
        if tag in tags:
            print(f"{label} scriptlet:\n{tags[tag][0]}", file=f)
with open(f"{out}/rpm.version", "w") as f:
    print(f"{tags[1001][0]}-{tags[1002][0]}", file=f)  # VERSION-RELEASE
PY
fi
cat "$work/rpm.list"
expect_all "$work/rpm.list" "$rpm" "${common[@]}" "${rpm_only[@]}"
for conffile in etc/salt-keysync/config.toml etc/logrotate.d/salt-keysync; do
    grep -qE "^$conffile [a-z]*c[a-z]*n|^$conffile [a-z]*n[a-z]*c" "$work/rpm.flags" \
        || fail "$rpm: $conffile is not %config(noreplace): $(grep "^$conffile " "$work/rpm.flags")"
done
for scriptlet in preinstall postinstall preuninstall postuninstall; do
    grep -q "^$scriptlet scriptlet" "$work/rpm.scripts" || fail "$rpm: no $scriptlet scriptlet"
done
# cargo-generate-rpm takes a script path that does not exist as the script
# text itself; make sure the files' contents were used.
grep -q "systemctl daemon-reload" "$work/rpm.scripts" || fail "$rpm: scriptlets are not packaging/rpm/*.sh"
grep -q SALT_KEYSYNC_PURGE_AUDIT "$work/rpm.scripts" || fail "$rpm: %postun does not keep the audit log"
grep -qF "$private_dirs" "$work/rpm.scripts" || fail "$rpm: %post does not make the private folders"
grep -qF "refusing to install this package" "$work/rpm.scripts" || fail "$rpm: %pre does not refuse a store it cannot read"
[ "$(cat "$work/rpm.version")" = "$version-1" ] || fail "$rpm: version is $(cat "$work/rpm.version"), not $version-1"
echo "ok   .rpm: ${#common[@]} common + ${#rpm_only[@]} own files with their modes, %config, scriptlets"

# ---- install, run, remove, purge the .deb where the machine allows ----
if [ "$(id -u)" -ne 0 ] || ! command -v dpkg >/dev/null; then
    echo "not root or no dpkg: .deb contents checked, install not tried"
    exit 0
fi
if dpkg-query -W -f '${Status}' salt-keysync 2>/dev/null | grep -q installed; then
    echo "salt-keysync is already installed on this machine: not touching it (contents checked, install not tried)"
    exit 0
fi
[ ! -e /var/log/salt-keysync ] && [ ! -e /var/lib/salt-keysync ] \
    || fail "/var/log/salt-keysync or /var/lib/salt-keysync exists without the package: remove it to let the install test run"
cleanup() {
    dpkg --purge salt-keysync >/dev/null 2>&1 || true
    rm -rf /var/log/salt-keysync /var/lib/salt-keysync /etc/salt-keysync "$work"
}
trap cleanup EXIT
mode_of() { stat -c %a "$1"; }

# 0.1.0 shipped the config as a conffile: upgraded without a terminal over
# an edited one whose example changed since, dpkg stopped at its question
# ("end of file on stdin at conffile prompt") and the upgrade failed. The
# same package laid out as 0.1.0 was, installed and edited, then this one
# with no terminal and nothing on stdin: no question, the edit kept.
echo "== upgrade from a 0.1.0 layout (config a conffile, edited) without a terminal"
old="$work/old"
dpkg-deb --raw-extract "$deb" "$old"
sed -i 's/^Version: .*/Version: 0.1.0-1/' "$old/DEBIAN/control"
install -d "$old/etc/salt-keysync"
{ cat packaging/config.toml; echo '# (the example as an older release shipped it)'; } >"$old/etc/salt-keysync/config.toml"
chmod 0600 "$old/etc/salt-keysync/config.toml"
echo /etc/salt-keysync/config.toml >>"$old/DEBIAN/conffiles"
dpkg-deb --build "$old" "$work/salt-keysync_0.1.0-1_amd64.deb" >/dev/null
dpkg -i "$work/salt-keysync_0.1.0-1_amd64.deb" >/dev/null
dpkg-query -W -f '${Conffiles}\n' salt-keysync | grep -q " /etc/salt-keysync/config.toml " \
    || fail "the 0.1.0 layout did not install the config as a conffile"
echo 'node = "edited-by-the-operator"' >>/etc/salt-keysync/config.toml
edited=$(sha256sum </etc/salt-keysync/config.toml)
setsid --wait dpkg -i "$deb" </dev/null >"$work/upgrade.out" 2>&1 \
    || fail "the upgrade without a terminal failed: $(tail -n 5 "$work/upgrade.out")"
[ "$(dpkg-query -W -f '${Status} ${Version}' salt-keysync)" = "install ok installed $version-1" ] \
    || fail "not upgraded: $(dpkg-query -W -f '${Status} ${Version}' salt-keysync)"
[ "$(sha256sum </etc/salt-keysync/config.toml)" = "$edited" ] || fail "the upgrade changed the edited config"
[ "$(stat -c '%a %U' /etc/salt-keysync/config.toml)" = "640 root" ] \
    || fail "config after the upgrade: $(stat -c '%a %U' /etc/salt-keysync/config.toml)"
echo "ok   0.1.0 layout → $version-1 without a terminal: no question, the edited config kept"
# (dpkg purges the conffile 0.1.0 left, now obsolete, with the package.)
SALT_KEYSYNC_PURGE_AUDIT=yes dpkg --purge salt-keysync >/dev/null
[ ! -e /etc/salt-keysync/config.toml ] || fail "purge after the upgrade kept the config"
rm -rf /etc/salt-keysync

echo "== dpkg -i $deb"
dpkg -i "$deb"
protocol=$(sed -n 's/^pub const PROTOCOL_VERSION: u32 = \([0-9]*\);/\1/p' proto/src/lib.rs)
[[ "$(salt-keysync --version)" == "salt-keysync $version (protocol $protocol, "* ]] \
    || fail "installed --version: $(salt-keysync --version), not salt-keysync $version (protocol $protocol, …)"
salt-keysync check --help | grep -q "Examples:" || fail "installed check --help has no examples"
# Every document the binary points an operator to is on the host.
named_docs=$(salt-keysync recover --help | grep -o '/usr/share/doc/salt-keysync/[A-Za-z0-9._-]*' | sort -u)
[ -n "$named_docs" ] || fail "recover --help names no installed document"
for doc in $named_docs /usr/share/doc/salt-keysync/SECURITY.md; do
    [ -f "$doc" ] || fail "$doc is named but not installed"
done
# No salt-master here: the agent's user is root (the systemd test in
# tests/systemd/ installs the package beside a salt-master running as salt).
for dir in /var/lib/salt-keysync /var/log/salt-keysync; do
    [ "$(stat -c '%a %U' $dir)" = "700 root" ] || fail "$dir: $(stat -c '%a %U' $dir), not 700 root"
done
[ "$(stat -c '%a %U:%G' /etc/salt-keysync)" = "750 root:root" ] || fail "/etc/salt-keysync: $(stat -c '%a %U:%G' /etc/salt-keysync)"
[ "$(mode_of /etc/salt-keysync/config.toml)" = 640 ] || fail "config.toml mode $(mode_of /etc/salt-keysync/config.toml)"
cmp -s /etc/salt-keysync/config.toml /usr/share/salt-keysync/config.toml || fail "postinst's config.toml is not the example"
# The packaged config parses; check then stops at the certificates that the
# operator has yet to make, naming them.
if salt-keysync check >"$work/check.out" 2>&1; then fail "check passed without certificates"; fi
grep -q "/etc/salt-keysync/tls" "$work/check.out" || fail "check does not name the missing certificates: $(cat "$work/check.out")"
echo "ok   salt-keysync check on the packaged config: $(grep -m1 FAIL "$work/check.out" || tail -1 "$work/check.out")"
if command -v systemd-analyze >/dev/null; then
    # --man=no: the unit's Documentation= names man pages, which systemd
    # looks up with man(1); a host without man-db would fail the check.
    systemd-analyze verify --man=no /usr/lib/systemd/system/salt-keysync.service \
        || fail "systemd-analyze verify of the installed unit"
    echo "ok   systemd-analyze verify --man=no /usr/lib/systemd/system/salt-keysync.service"
fi
# The generator that sets User= from the master config: root here (no
# salt-master), written where systemd would read it.
/usr/lib/systemd/system-generators/salt-keysync-generator "$work/generator"
grep -qx "User=root" "$work/generator/salt-keysync.service.d/50-master-user.conf" \
    || fail "the generator's drop-in does not say User=root: $(cat "$work/generator/salt-keysync.service.d/50-master-user.conf")"
echo "ok   salt-keysync-generator: User=root without a salt-master config"
if command -v man >/dev/null; then
    [ "$(man -w salt-keysync)" = /usr/share/man/man1/salt-keysync.1.gz ] || fail "man -w salt-keysync: $(man -w salt-keysync)"
fi
bash -n /usr/share/bash-completion/completions/salt-keysync || fail "bash completion is not valid bash"
diff -r packaging/salt-formula /usr/share/salt-keysync/salt-formula || fail "the installed Salt formula differs from packaging/salt-formula"
echo "ok   the Salt formula installed as in packaging/salt-formula"
if command -v promtool >/dev/null; then
    # The command docs/monitoring.md gives, on the installed rules.
    promtool check rules /usr/share/salt-keysync/monitoring/alerts.yml || fail "promtool check rules on the installed alerts.yml"
    python3 -c 'import json, sys; json.load(open(sys.argv[1]))' /usr/share/salt-keysync/monitoring/dashboard.json \
        || fail "the installed dashboard.json is not JSON"
    echo "ok   promtool check rules /usr/share/salt-keysync/monitoring/alerts.yml"
fi

echo "== dpkg -r (remove keeps config, state and audit log)"
echo '{"marker":"audit"}' >/var/log/salt-keysync/audit.jsonl
echo state >/var/lib/salt-keysync/state.redb
dpkg -r salt-keysync
[ ! -e /usr/bin/salt-keysync ] || fail "remove left /usr/bin/salt-keysync"
[ -f /etc/salt-keysync/config.toml ] && [ -f /var/lib/salt-keysync/state.redb ] && [ -f /var/log/salt-keysync/audit.jsonl ] \
    || fail "remove deleted config, state or audit log"

echo "== dpkg --purge (state goes, audit log stays)"
dpkg --purge salt-keysync
[ ! -e /var/lib/salt-keysync ] || fail "purge kept /var/lib/salt-keysync"
[ ! -e /etc/salt-keysync/config.toml ] || fail "purge kept the config"
grep -q marker /var/log/salt-keysync/audit.jsonl || fail "purge deleted the audit log"

echo "== SALT_KEYSYNC_PURGE_AUDIT=yes dpkg --purge (audit log goes too)"
dpkg -i "$deb" >/dev/null
SALT_KEYSYNC_PURGE_AUDIT=yes dpkg --purge salt-keysync
[ ! -e /var/log/salt-keysync ] || fail "SALT_KEYSYNC_PURGE_AUDIT=yes kept /var/log/salt-keysync"
echo "ok   .deb installs, runs, removes and purges cleanly; purge keeps the audit log unless asked"


# ---- a downgrade below the state store's format (issue 29 item 5) ----
# 0.1.0 read 0.2.0's store as corrupt and crash-looped, while apt returned 0.
# Now the store's format is written beside it (state.format, as
# agent/store/src/format.rs writes it), and the package scripts refuse
# to put a release that cannot read it in place: the installed package's
# prerm at `upgrade OLDER`, the older package's prerm at `failed-upgrade`
# (dpkg tries it when ours fails), its preinst when it is installed anew.
# The older release is this package with the scripts of a release that
# reads format 1 only; then the real 0.1.0 scripts, which do not stop it.
echo "== a downgrade below the state store's format, with apt-get --allow-downgrades and dpkg"
format=$(sed -n 's/^pub const FORMAT: u32 = \([0-9]*\);/\1/p' agent/store/src/format.rs)
format_since=$(sed -n 's/^pub const FORMAT_SINCE: &str = "\(.*\)";/\1/p' agent/store/src/format.rs)
[ -n "$format" ] && [ -n "$format_since" ] || fail "no FORMAT or FORMAT_SINCE in agent/store/src/format.rs"
older="$work/older"
rm -rf "$older"
dpkg-deb --raw-extract "$deb" "$older"
sed -i 's/^Version: .*/Version: 0.1.9-1/' "$older/DEBIAN/control"
for script in preinst prerm; do
    [ -f "$older/DEBIAN/$script" ] || fail "$deb has no $script"
    grep -qx "reads=$format" "$older/DEBIAN/$script" \
        || fail "$script does not say reads=$format (agent/store/src/format.rs)"
    sed -i "s/^reads=.*/reads=$((format - 1))/" "$older/DEBIAN/$script"
done
dpkg-deb --build "$older" "$work/salt-keysync_0.1.9-1_amd64.deb" >/dev/null
store_as_the_agent_leaves_it() {
    printf '# salt-keysync: the format of state.redb beside it.\nformat %s\nwritten-by %s\nread-since %s\n' \
        "$format" "$version" "$format_since" >/var/lib/salt-keysync/state.format
    echo "a store" >/var/lib/salt-keysync/state.redb
    chmod 0600 /var/lib/salt-keysync/state.format /var/lib/salt-keysync/state.redb
}
installed() { dpkg-query -W -f '${Status} ${Version}' salt-keysync 2>/dev/null || true; }
# refusal_names_the_way_out OUT PHRASE...: OUT says why, the ways out, and each PHRASE.
refusal_names_the_way_out() {
    local out=$1 what
    shift
    for what in "$@" "format $format (written by salt-keysync $version)" "install salt-keysync $format_since or later" \
        "recover --from-peers"; do
        grep -qF -- "$what" "$out" || fail "the refusal does not say '$what': $(cat "$out")"
    done
}
dpkg -i "$deb" >/dev/null
store_as_the_agent_leaves_it
binary_before=$(sha256sum </usr/bin/salt-keysync)
if setsid --wait apt-get install -y --allow-downgrades "$work/salt-keysync_0.1.9-1_amd64.deb" </dev/null \
    >"$work/downgrade.out" 2>&1; then
    fail "apt-get install --allow-downgrades of a release that cannot read the store succeeded: $(tail -n 5 "$work/downgrade.out")"
fi
[ "$(installed)" = "install ok installed $version-1" ] || fail "after the refused downgrade: $(installed)"
[ "$(sha256sum </usr/bin/salt-keysync)" = "$binary_before" ] || fail "the refused downgrade replaced the binary"
refusal_names_the_way_out "$work/downgrade.out" "refusing to downgrade to salt-keysync 0.1.9-1" \
    "refusing to replace salt-keysync $version-1 by this package" "Nothing was changed"
echo "ok   apt-get install --allow-downgrades of a release reading format $((format - 1)): refused, $version-1 left in place"
# Removed (state kept), then installed anew: the older preinst refuses.
dpkg -r salt-keysync >/dev/null
if dpkg -i "$work/salt-keysync_0.1.9-1_amd64.deb" >"$work/install-older.out" 2>&1; then
    fail "the older release was installed over a store it cannot read: $(tail -n 5 "$work/install-older.out")"
fi
[ ! -e /usr/bin/salt-keysync ] || fail "the refused install left /usr/bin/salt-keysync"
refusal_names_the_way_out "$work/install-older.out" "refusing to install this package" "Nothing was changed"
echo "ok   dpkg -i of that release after dpkg -r: refused by its preinst, nothing unpacked"
# 0.1.0's own scripts (no preinst, its prerm exits 0 on failed-upgrade):
# dpkg goes on after our prerm's refusal, which is still printed.
dpkg -i "$deb" >/dev/null
old_scripts=f010ce54732fa5551ef675f456976a6f3ee84611
rm -rf "$older"
dpkg-deb --raw-extract "$deb" "$older"
sed -i 's/^Version: .*/Version: 0.1.0-1/' "$older/DEBIAN/control"
rm -f "$older/DEBIAN/preinst"
for script in prerm postinst postrm; do
    git show "$old_scripts:packaging/debian/$script" >"$older/DEBIAN/$script" || fail "git show $old_scripts (0.1.0's scripts)"
    chmod 0755 "$older/DEBIAN/$script"
done
dpkg-deb --build "$older" "$work/salt-keysync_0.1.0-1_amd64.deb" >/dev/null
setsid --wait dpkg -i "$work/salt-keysync_0.1.0-1_amd64.deb" </dev/null >"$work/to-010.out" 2>&1 \
    || fail "dpkg -i of 0.1.0's scripts failed: $(tail -n 5 "$work/to-010.out")"
[ "$(installed)" = "install ok installed 0.1.0-1" ] || fail "after the downgrade to 0.1.0's scripts: $(installed)"
refusal_names_the_way_out "$work/to-010.out" "refusing to downgrade to salt-keysync 0.1.0-1" \
    "dpkg goes on with them"
echo "ok   a downgrade to 0.1.0's scripts is not stopped (they have no preinst and accept failed-upgrade); the refusal is printed"
SALT_KEYSYNC_PURGE_AUDIT=yes dpkg --purge salt-keysync >/dev/null
rm -rf /var/lib/salt-keysync /var/log/salt-keysync /etc/salt-keysync
