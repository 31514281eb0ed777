#!/usr/bin/env bash
# Installs the Debian packages the test suite needs beyond cargo, if any is
# missing (./scripts/test.sh runs this first; as root):
#   systemd-container  systemd-nspawn, to boot the package's test system
#   mmdebstrap         to build that system's tree (tests/systemd/image.sh)
#   util-linux, procps unshare, nsenter, flock; pgrep
#   python3-venv       the Salt venvs (tests/salt/venv.sh)
# Does nothing when every command is there; never upgrades anything.
set -euo pipefail

declare -A package_of=(
    [systemd-nspawn]=systemd-container
    [mmdebstrap]=mmdebstrap
    [unshare]=util-linux
    [nsenter]=util-linux
    [flock]=util-linux
    [pgrep]=procps
    [dpkg-deb]=dpkg
    [python3]=python3-venv
)
missing=()
for command in "${!package_of[@]}"; do
    command -v "$command" >/dev/null || missing+=("${package_of[$command]}")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ]; then
    echo "install-test-deps: missing ${missing[*]}; run this as root to install them" >&2
    exit 1
fi
echo "== apt-get install ${missing[*]}"
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
