#!/usr/bin/env bash
# Runs every check and test of salt-keysync: formatting, clippy, and the whole
# workspace's tests (unit, simulation, multi-agent, black-box). This is the
# README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
