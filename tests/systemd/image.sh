#!/usr/bin/env bash
# Makes (or reuses) the minimal Debian bookworm tree tests/systemd/run.sh
# boots with systemd-nspawn: systemd, Python and Salt from PyPI in
# /opt/saltstack/salt (a venv, pinned like tests/salt/venv.sh's), nothing else
# (no procps: the unit must not need /bin/kill; no compiler).
#
#     tests/systemd/image.sh          # prints the tree's folder
#
# Cached under ${CARGO_TARGET_DIR:-target}/systemd-image/<key>/rootfs, where
# the key is a hash of this script, the package list and the Salt pins: a
# change to any of them builds a new tree (about 40 s for Debian's packages,
# 40-80 s for Salt) and removes the old one. Needs root and mmdebstrap;
# network access to deb.debian.org and PyPI only while building. Salt and
# its dependencies are fetched (and the few without a wheel for Linux,
# such as timelib, compiled) by the host's pip, with the host's pip
# settings and cache, into wheels the tree installs from without network.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac

SUITE=bookworm
MIRROR=http://deb.debian.org/debian
# logrotate: the package recommends it, and the test rotates the audit log.
PACKAGES=systemd,python3,python3-venv,logrotate
SALT_VERSION=3008.3
constraints="$repo/tests/salt/constraints-$SALT_VERSION.txt"

die() { echo "systemd-image: error: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root (mmdebstrap makes a tree owned by root)"
command -v mmdebstrap >/dev/null || die "mmdebstrap is missing (apt-get install mmdebstrap)"
[ -f "$constraints" ] || die "$constraints is missing"

key=$(cat "${BASH_SOURCE[0]}" "$constraints" | sha256sum | cut -c1-16)
base="$target/systemd-image"
dir="$base/$key"
mkdir -p "$base"
exec {lock}>"$base/.lock"
flock "$lock"

if [ ! -f "$dir/complete" ]; then
    # Trees of earlier keys are of no more use; each is ~500 MB.
    find "$base" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
    mkdir -p "$dir"
    started=$SECONDS
    echo "systemd-image: building $dir (bookworm + Salt $SALT_VERSION, once)" >&2
    pyver=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$pyver" = 3.11 ] || die "python3 is $pyver; the wheels must be for bookworm's Python 3.11"
    if ! python3 -m pip wheel --quiet --disable-pip-version-check --no-input --wheel-dir "$dir/wheels" \
        -c "$constraints" "salt==$SALT_VERSION" >"$dir/wheels.log" 2>&1; then
        tail -n 30 "$dir/wheels.log" >&2
        rm -rf "$dir"
        die "pip wheel salt==$SALT_VERSION failed (log above)"
    fi
    # pip runs in the new tree with its own Python; nothing of the host's
    # environment goes in (env -i).
    if ! mmdebstrap --quiet --variant=minbase --include="$PACKAGES" \
        --customize-hook="copy-in $dir/wheels /tmp" \
        --customize-hook='chroot "$1" python3 -m venv /opt/saltstack/salt' \
        --customize-hook="env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot \"\$1\" /opt/saltstack/salt/bin/pip install --quiet --disable-pip-version-check --no-index --find-links /tmp/wheels salt==$SALT_VERSION" \
        --customize-hook='rm -rf "$1/tmp/wheels"' \
        --customize-hook='for tool in salt-master salt-key salt-minion salt-call salt; do ln -s /opt/saltstack/salt/bin/$tool "$1/usr/bin/$tool"; done' \
        --customize-hook="env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot \"\$1\" salt-key --version >$dir/salt-version 2>&1 || true" \
        "$SUITE" "$dir/rootfs" "$MIRROR" >"$dir/build.log" 2>&1; then
        tail -n 30 "$dir/build.log" >&2
        rm -rf "$dir"
        die "mmdebstrap failed (log above)"
    fi
    # (Run by the last hook: Salt needs /proc, which mmdebstrap mounts for hooks.)
    version=$(cat "$dir/salt-version")
    [[ "$version" == "salt-key $SALT_VERSION "* ]] || { rm -rf "$dir"; die "Salt in the tree: salt-key --version says '$version', not $SALT_VERSION"; }
    rm -rf "$dir/wheels"
    touch "$dir/complete"
    echo "systemd-image: built in $((SECONDS - started)) s" >&2
fi
echo "$dir/rootfs"
