#!/usr/bin/env bash
# Installs the Debian packages the tests need and a fresh machine lacks
# (called by scripts/test.sh; as root, with apt-get). Each package is
# installed only when the command it provides is missing, so a machine that
# has them is left alone and nothing is fetched.
set -euo pipefail

# "command package" pairs.
needed=(
    "rsync rsync"
    # tests/systemd/run.sh: boots a minimal Debian under systemd-nspawn,
    # built with mmdebstrap; unshare, nsenter and flock come with util-linux.
    "systemd-nspawn systemd-container"
    "mmdebstrap mmdebstrap"
    "unshare util-linux"
    "pgrep procps"
)

missing=()
for pair in "${needed[@]}"; do
    command -v "${pair%% *}" >/dev/null 2>&1 || missing+=("${pair#* }")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "deps: missing ${missing[*]}; install them (Debian: apt-get install ${missing[*]})" >&2
    exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
