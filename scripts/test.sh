#!/usr/bin/env bash
# Runs every check and test of salt-keysync: formatting, clippy, the alert
# rules (promtool check and unit tests), the Salt venvs the real-Salt tests
# need (made once, cached under target/), and the whole workspace's tests
# (unit, simulation, multi-agent, black-box, real salt-key), then builds
# the .deb and .rpm and checks them (installing the .deb where the machine
# allows), and runs the .deb under a real systemd in a minimal Debian
# container (tests/systemd/run.sh; scripts/deps.sh first installs, as root,
# the Debian packages it needs). This is the README's test command; .ci/run
# calls it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== Debian packages the tests need"
scripts/deps.sh
# A clean clone builds once: incremental caches only take disk.
export CARGO_INCREMENTAL=0
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== alert rules (promtool check rules, promtool test rules)"
scripts/check-monitoring.sh
echo "== Salt venvs (3008.3, 3007.15, 3006.28)"
tests/salt/venv.sh
echo "== cargo test"
# Every test binary, also after one failed: a failure in the first must not
# hide the others' (cargo still exits non-zero).
cargo test --workspace --locked --no-fail-fast
echo "== packages (.deb and .rpm)"
scripts/package.sh
scripts/check-packages.sh
echo "== the .deb under systemd, beside a salt-master running as salt"
tests/systemd/run.sh
