#!/usr/bin/env bash
# Record what a live salt-master does to its pki_dir: its first start (folders, master
# keys) and a new minion's first authentication (the pending key file).
#
# Usage: tests/salt/record-auth.sh [VERSION...]   (default: 3008.3 3006.28)
#
# Runs one salt-master and one salt-minion per version on 127.0.0.1 (ports 45xx),
# each in its own process group, under /tmp/skau.<ver>/ ; stops both at the end.
# Needs inotifywait. Output is plain text on stdout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v inotifywait >/dev/null || { echo "needs inotifywait (apt-get install inotify-tools)" >&2; exit 1; }
if [ "$#" -gt 0 ]; then versions=("$@"); else versions=(3008.3 3006.28); fi
declare -A VENV
while read -r ver dir; do VENV[$ver]="$dir"; done < <("$here/venv.sh" "${versions[@]}")

pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
    sleep 1
    for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# start LOG CMD...: run CMD as the leader of a new process group (detached from this
# shell, so no job messages); prints its pid, which is also the group id
start() {
    local log="$1"; shift
    (setsid "$@" </dev/null >"$log" 2>&1 & echo $!)
}

listing() {
    (cd "$1" && find . -mindepth 1 \( -path ./var -o -path ./sock -o -path ./cache \) -prune -o -printf '    %M %u:%g %5s  %P%l\n' | sort -k4)
}

port=4510
for ver in "${versions[@]}"; do
    D="/tmp/skau.$ver"
    rm -rf "$D"; mkdir -p "$D/m" "$D/n"
    pub=$((port)); ret=$((port + 1)); port=$((port + 10))
    cat >"$D/m/master" <<EOF
id: livemaster
interface: 127.0.0.1
publish_port: $pub
ret_port: $ret
root_dir: $D/m
pki_dir: $D/m/pki
cachedir: $D/m/cache
sock_dir: $D/m/sock
pidfile: $D/m/master.pid
log_file: $D/m/master.log
log_level_logfile: info
user: root
EOF
    cat >"$D/n/minion" <<EOF
id: live-minion
master: 127.0.0.1
master_port: $ret
publish_port: $pub
root_dir: $D/n
pki_dir: $D/n/pki
cachedir: $D/n/cache
sock_dir: $D/n/sock
pidfile: $D/n/minion.pid
log_file: $D/n/minion.log
user: root
acceptance_wait_time: 1
EOF
    echo "=================== salt $ver"
    ev="$D/events"; : >"$D/inotify.err"
    inotifywait -m -r --format '%e %w%f' \
        -e create -e modify -e attrib -e close_write -e moved_from -e moved_to -e delete \
        "$D/m" >"$ev" 2>"$D/inotify.err" &
    ipid=$!
    for _ in $(seq 100); do grep -q 'Watches established' "$D/inotify.err" && break; sleep 0.05; done

    pids+=("$(start "$D/master.out" "${VENV[$ver]}/bin/salt-master" -c "$D/m" -l quiet)")
    for _ in $(seq 300); do [ -S "$D/m/sock/master_event_pub.ipc" ] || [ -e "$D/m/sock/master_event_pub.ipc" ] && break; sleep 0.1; done
    sleep 3
    echo "--- master started; events under its root (pki/ and cache/.dfn only):"
    grep -E ' [^ ]*/m/(pki/|cache/\.dfn)' "$ev" | sed -e "s|$D/m/||" -e 's/^/    /' | head -n 60
    echo "--- master root after start:"; listing "$D/m"
    : >"$ev.mark"; n0=$(wc -l <"$ev")

    pids+=("$(start "$D/minion.out" "${VENV[$ver]}/bin/salt-minion" -c "$D/n" -l quiet)")
    for _ in $(seq 300); do [ -e "$D/m/pki/minions_pre/live-minion" ] && break; sleep 0.1; done
    sleep 2
    echo "--- minion's first auth: events in pki/"
    tail -n "+$((n0 + 1))" "$ev" | grep ' [^ ]*/m/pki/' | sed -e "s|$D/m/||" -e 's/^/    /'
    f="$D/m/pki/minions_pre/live-minion"
    if [ -e "$f" ]; then
        echo "--- pending key file: $(stat -c '%A %U:%G %s bytes' "$f")"
        printf '    last bytes:'; tail -c 8 "$f" | od -An -c
        printf '    minion.pub:  %s bytes, last bytes:' "$(stat -c %s "$D/n/pki/minion.pub")"; tail -c 8 "$D/n/pki/minion.pub" | od -An -c
    else
        echo "--- no pending key appeared; master log:"; tail -n 20 "$D/m/master.log" || true
    fi
    kill "$ipid"; wait "$ipid" 2>/dev/null || true
    cleanup; pids=()
    echo
done
