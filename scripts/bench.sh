#!/usr/bin/env bash
# Runs the salt-keysync benchmark (issue 5): builds the release agent and
# benchmark, installs rsync if it is missing (the join is compared with
# `rsync -a`), and runs three agents on loopback. Arguments go to the
# benchmark: `scripts/bench.sh --quick`, `scripts/bench.sh --json out.json`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v rsync >/dev/null; then
    echo "== installing rsync (the join is compared with rsync -a)"
    if [ "$(id -u)" = 0 ]; then apt-get install -y rsync; else sudo apt-get install -y rsync; fi
fi
cargo build --release --locked -p salt-keysync -p keysync-bench
exec target/release/keysync-bench "$@"
