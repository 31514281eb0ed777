#!/usr/bin/env bash
# Makes docs/monitoring-dashboard.png: three agents on loopback beside real
# Salt installations (3008.3 on master-a and master-b, 3006.28 on master-c),
# scraped by a real Prometheus (Debian's package) that also loads the
# shipped alert rules, while key decisions are made on master-a and
# master-b; master-c's agent is stopped for two minutes and master-b is
# switched to `auto_accept: True` with another publisher_acl. Then
# scripts/render-dashboard.py draws the dashboard's panels from the
# dashboard's own queries, evaluated by that Prometheus.
#
#     scripts/dashboard-demo.sh            # ~11 minutes; --minutes N to change
#     scripts/dashboard-demo.sh --keep     # leave the folder and print it
#
# Needs: the Salt venvs (tests/salt/venv.sh), openssl, prometheus (installed
# here as root if missing), and matplotlib from PyPI in target/render-venv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
minutes=10
keep=no
while [ $# -gt 0 ]; do
    case $1 in
        --minutes) minutes=$2; shift 2 ;;
        --keep) keep=yes; shift ;;
        *) echo "dashboard-demo: unknown argument $1" >&2; exit 2 ;;
    esac
done
target=${CARGO_TARGET_DIR:-$repo/target}

if ! command -v prometheus >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
venvs=$(tests/salt/venv.sh 3008.3 3006.28)
salt_new=$(echo "$venvs" | awk '$1 == "3008.3" {print $2}')/bin/salt-master
salt_old=$(echo "$venvs" | awk '$1 == "3006.28" {print $2}')/bin/salt-master
if [ ! -x "$target/render-venv/bin/python" ] || ! "$target/render-venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    python3 -m venv "$target/render-venv"
    "$target/render-venv/bin/pip" install -q matplotlib==3.9.2
fi
cargo build --release --locked -p salt-keysync
bin=$target/release/salt-keysync

work=$(mktemp -d /tmp/keysync-dashboard.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "$keep" = yes ]; then echo "dashboard-demo: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# Certificates, one master key pair shared by all three, a pool of minion keys.
"$bin" certs init --dir "$work/tls" >/dev/null
openssl genrsa -out "$work/master.pem" 2048 2>/dev/null
openssl rsa -in "$work/master.pem" -pubout -out "$work/master.pub" 2>/dev/null
for i in $(seq 1 8); do
    openssl genrsa 2048 2>/dev/null | openssl rsa -pubout -out "$work/minion$i.pub" 2>/dev/null
done

names=(master-a master-b master-c)
port() { echo $((45150 + $1)); }
mport() { echo $((45160 + $1)); }
for i in 0 1 2; do
    name=${names[$i]}
    dir=$work/$name
    "$bin" certs issue "$name" --dir "$work/tls" >/dev/null
    install -d -m 0700 "$dir" "$dir/pki" "$dir/cache" "$dir/state"
    install -d -m 0755 "$dir/pki/minions" "$dir/pki/minions_pre" "$dir/pki/minions_rejected"
    cp "$work/master.pub" "$dir/pki/master.pub"
    printf 'interface: 127.0.0.1\npublisher_acl:\n  ops:\n    - test.*\n' >"$dir/master"
    salt_master=$salt_new
    [ "$name" = master-c ] && salt_master=$salt_old
    {
        echo "node = \"$name\""
        echo "pki_dir = \"$dir/pki\""
        echo "state_dir = \"$dir/state\""
        echo "listen = \"127.0.0.1:$(port $i)\""
        echo "metrics_listen = \"127.0.0.1:$(mport $i)\""
        echo "[tls]"
        echo "ca = \"$work/tls/ca.pem\""
        echo "cert = \"$work/tls/$name.pem\""
        echo "key = \"$work/tls/$name.key\""
        echo "[salt]"
        echo "master_config = \"$dir/master\""
        echo "cachedir = \"$dir/cache\""
        echo "version_command = [\"$salt_master\", \"--version\"]"
        echo "[timings]"
        echo "anti_entropy_interval = \"10s\""
        for j in 0 1 2; do
            [ "$j" = "$i" ] && continue
            echo "[[peer]]"
            echo "name = \"${names[$j]}\""
            echo "address = \"127.0.0.1:$(port $j)\""
        done
    } >"$dir/config.toml"
    chmod 0600 "$dir/config.toml" "$work/tls/$name.key"
done
start_agent() {
    "$bin" run --config "$work/$1/config.toml" >>"$work/$1/agent.log" 2>&1 &
    agent_pid[$2]=$!
    pids+=($!)
}
declare -a agent_pid
for i in 0 1 2; do start_agent "${names[$i]}" "$i"; done

cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files:
  - $repo/packaging/monitoring/alerts.yml
scrape_configs:
  - job_name: salt-keysync
    static_configs:
      - targets: ["127.0.0.1:$(mport 0)", "127.0.0.1:$(mport 1)", "127.0.0.1:$(mport 2)"]
EOF
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/prom" \
    --web.listen-address=127.0.0.1:45190 >"$work/prometheus.log" 2>&1 &
pids+=($!)

start=$(date +%s)
end=$((start + minutes * 60))
n=0
# Decisions as salt-key makes them: a pending key arrives on the master, then
# is accepted, rejected, or later deleted.
decide() {
    local master=$1 verb=$2 id=$3
    local pki=$work/$master/pki
    cp "$work/minion$(( (n % 8) + 1 )).pub" "$pki/minions_pre/$id"
    case $verb in
        accept) mv "$pki/minions_pre/$id" "$pki/minions/$id" ;;
        reject) mv "$pki/minions_pre/$id" "$pki/minions_rejected/$id" ;;
    esac
}
stopped_c=no restarted_c=no drifted_b=no
while [ "$(date +%s)" -lt "$end" ]; do
    now=$(( $(date +%s) - start ))
    n=$((n + 1))
    master=master-a
    [ $((n % 3)) = 0 ] && master=master-b
    if [ $((n % 7)) = 0 ]; then decide "$master" reject "db$n"; else decide "$master" accept "web$n"; fi
    if [ $((n % 5)) = 0 ] && [ -e "$work/master-a/pki/minions/web$((n - 4))" ]; then
        rm -f "$work/master-a/pki/minions/web$((n - 4))"
    fi
    if [ "$stopped_c" = no ] && [ "$now" -ge $((minutes * 60 * 3 / 10)) ]; then
        kill "${agent_pid[2]}"; stopped_c=yes
    fi
    if [ "$restarted_c" = no ] && [ "$now" -ge $((minutes * 60 / 2)) ]; then
        start_agent master-c 2; restarted_c=yes
    fi
    if [ "$drifted_b" = no ] && [ "$now" -ge $((minutes * 60 * 6 / 10)) ]; then
        mkdir -p "$work/master-b/master.d"
        printf 'auto_accept: True\npublisher_acl:\n  ops:\n    - .*\n' >"$work/master-b/master.d/open.conf"
        drifted_b=yes
    fi
    sleep 2
done
sleep 10 # one more scrape and rule evaluation of the last state

"$target/render-venv/bin/python" scripts/render-dashboard.py --prometheus http://127.0.0.1:45190 \
    --start "$start" --end "$(date +%s)" --step 10 --rate-interval 1m --out docs/monitoring-dashboard.png
echo "== alerts firing at the end (from the shipped rules):"
curl -s http://127.0.0.1:45190/api/v1/alerts | python3 -c '
import json, sys
for a in json.load(sys.stdin)["data"]["alerts"]:
    print(a["state"], a["labels"]["alertname"], {k: v for k, v in a["labels"].items() if k not in ("alertname", "job")})
'
# Exit status 3: a finding is an error (master-b auto-accepts), as intended here.
"$bin" status --cluster --config "$work/master-a/config.toml" || [ $? -eq 3 ]
