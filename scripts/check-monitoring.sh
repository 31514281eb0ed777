#!/usr/bin/env bash
# Checks the Prometheus alert rules shipped in packaging/monitoring/ with
# Prometheus's own tool: `promtool check rules` (syntax, PromQL, templates)
# and `promtool test rules` (the unit tests in alerts.test.yml: each alert
# fires when it should, with its labels and rendered annotations, and not
# otherwise). promtool comes with Debian's prometheus package, installed
# here when missing (as root; `apt-get update` first).
#
# That every metric the rules and the dashboard use is one a running agent
# exports, and the naming and runbook conventions, are checked by
# `cargo test -p keysync-tests --test it monitoring`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v promtool >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "check-monitoring: FAIL: promtool is missing; install it as root: apt-get update && apt-get install -y --no-install-recommends prometheus" >&2
        exit 1
    fi
    echo "== apt-get install prometheus (for promtool)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
promtool --version | head -1

echo "== promtool check rules"
promtool check rules packaging/monitoring/alerts.yml
echo "== promtool test rules"
promtool test rules packaging/monitoring/alerts.test.yml
