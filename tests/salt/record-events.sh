#!/usr/bin/env bash
# Record what real `salt-key` does to a master's pki_dir, as inotify sees it.
#
# Usage: tests/salt/record-events.sh [VERSION...]   (default: 3008.3 3006.28)
#
# Needs inotifywait (Debian: apt-get install inotify-tools). Gets its Salt from
# tests/salt/venv.sh. Each scenario runs in a fresh folder /tmp/skev.<ver>.<name>/
# holding DIR/master (root_dir=DIR, pki_dir=DIR/pki, cachedir=DIR/cache,
# sock_dir=DIR/sock, user: root); no salt-master runs. The folders are left in
# place for inspection and removed at the next run. Output is plain text on stdout;
# tests/salt/FINDINGS.md summarises it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v inotifywait >/dev/null || { echo "needs inotifywait (apt-get install inotify-tools)" >&2; exit 1; }
if [ "$#" -gt 0 ]; then versions=("$@"); else versions=(3008.3 3006.28); fi

declare -A VENV
while read -r ver dir; do VENV[$ver]="$dir"; done < <("$here/venv.sh" "${versions[@]}")

D=""       # current scenario folder
SK=()      # salt-key command for the current scenario

# new_dir VER NAME: fresh master folder with the pki sub-folders salt-master would create
new_dir() {
    D="/tmp/skev.$1.$2"
    rm -rf "$D"
    mkdir -p "$D"/pki/{minions,minions_pre,minions_rejected,minions_denied,minions_autosign} "$D"/cache "$D"/sock
    printf 'root_dir: %s\npki_dir: %s/pki\ncachedir: %s/cache\nsock_dir: %s/sock\nuser: root\n' \
        "$D" "$D" "$D" "$D" >"$D/master"
    SK=("${VENV[$1]}/bin/salt-key" -c "$D")
}

# put FOLDER ID KEYNAME: place a generated public key (bytes as generated, mode 0644)
put() { install -m 0644 "$GEN/$3.pub" "$D/pki/$1/$2"; }

# which generated key a file holds ("k1".."k4"), else a short sha256
keyname() {
    local f="$1" k
    for k in "$GEN"/k*.pub; do
        if [ -f "$k" ] && cmp -s "$f" "$k"; then basename "$k" .pub; return; fi
    done
    printf 'sha256:%.12s' "$(sha256sum <"$f")"
}

tree() {
    local f
    while IFS= read -r f; do
        if [ -L "$D/$f" ]; then
            printf '    %s -> %s\n' "$f" "$(readlink "$D/$f")"
        else
            printf '    %s %s %4s  %-28s %s\n' "$(stat -c '%A' "$D/$f")" "$(stat -c '%U:%G' "$D/$f")" \
                "$(stat -c '%s' "$D/$f")" "$f" "$(keyname "$D/$f")"
        fi
    done < <(cd "$D" && find pki cache -mindepth 1 \( -type f -o -type l \) | sort)
    if [ -e "$D/cache/.dfn" ]; then
        printf '    .dfn content: "%s"\n' "$(cat "$D/cache/.dfn")"
    fi
}

# watch_run TITLE CMD...: run CMD under inotifywait -m -r on pki/ and cache/
# ("before"/"after" list files under pki/ and cache/ as mode owner size path)
watch_run() {
    local title="$1"; shift
    local ev="$D/.events" err="$D/.inotify.err" out rc
    : >"$err"
    echo "--- $title"
    echo "before:"; tree
    # Reads (OPEN, ACCESS, CLOSE_NOWRITE) are left out: salt-key lists every folder
    # several times per command and the agent has no use for them.
    inotifywait -m -r --format '%e %w%f' \
        -e create -e modify -e attrib -e close_write -e moved_from -e moved_to \
        -e delete -e delete_self -e move_self "$D/pki" "$D/cache" >"$ev" 2>"$err" &
    local pid=$!
    for _ in $(seq 100); do grep -q 'Watches established' "$err" && break; sleep 0.05; done
    set +e; out="$("$@" 2>&1)"; rc=$?; set -e
    sleep 0.3
    kill "$pid"; wait "$pid" 2>/dev/null || true
    echo "\$ salt-key ${*:4}   (rc=$rc)"
    # (Salt's "unclosed MasterEvent/SyncWrapper" warnings are dropped)
    if [ -n "$out" ]; then grep -v '^unclosed ' <<<"$out" | sed 's/^/    | /' | head -n 20 || true; fi
    echo "events:"
    sed -e "s|$D/||" -e 's/^/    /' "$ev"
    echo "after:"; tree
    echo
}

for ver in "${versions[@]}"; do
    echo "=================== salt $ver ($("${VENV[$ver]}/bin/salt-key" --version))"
    GEN="/tmp/skev.$ver.keys"
    rm -rf "$GEN"; mkdir -p "$GEN"

    new_dir "$ver" gen
    watch_run "gen-keys: salt-key --gen-keys=k1 --gen-keys-dir=$GEN" \
        "${SK[@]}" --gen-keys=k1 --gen-keys-dir="$GEN"
    echo "gen-keys dir:"; find "$GEN" -mindepth 1 -printf '    %M %u:%g %6s  %f -> %l\n' | sort -k5
    for k in k2 k3 k4; do "${SK[@]}" --gen-keys=$k --gen-keys-dir="$GEN" >/dev/null 2>&1 || true; done
    printf 'k1.pub last bytes:'; tail -c 8 "$GEN/k1.pub" | od -An -c
    echo

    new_dir "$ver" acc;  put minions_pre m1 k1
    watch_run "accept from pending" "${SK[@]}" -a m1 -y

    new_dir "$ver" rejp; put minions_pre m1 k1
    watch_run "reject from pending" "${SK[@]}" -r m1 -y

    new_dir "$ver" reja; put minions m1 k1
    watch_run "reject from accepted (no flag)" "${SK[@]}" -r m1 -y
    watch_run "reject from accepted --include-accepted" "${SK[@]}" -r m1 --include-accepted -y

    new_dir "$ver" dela; put minions m1 k1
    watch_run "delete accepted" "${SK[@]}" -d m1 -y

    new_dir "$ver" delp; put minions_pre m1 k1
    watch_run "delete pending" "${SK[@]}" -d m1 -y

    new_dir "$ver" delr; put minions_rejected m1 k1
    watch_run "delete rejected" "${SK[@]}" -d m1 -y

    new_dir "$ver" all; put minions_pre m1 k1; put minions_pre m2 k2; put minions_pre m3 k3
    watch_run "accept all pending" "${SK[@]}" -A -y

    new_dir "$ver" accr; put minions_rejected m1 k1
    watch_run "accept a rejected id (no flag)" "${SK[@]}" -a m1 -y
    watch_run "accept a rejected id --include-rejected" "${SK[@]}" -a m1 --include-rejected -y

    new_dir "$ver" list; put minions m1 k1; put minions_pre m2 k2; put minions_rejected m3 k3
    put minions_denied m4 k4; put minions .hidden k4
    watch_run "list as json" "${SK[@]}" -L --out json

    new_dir "$ver" finger; put minions m1 k1; head -c -1 "$GEN/k1.pub" >"$D/pki/minions/m2"
    watch_run "fingerprints: m1 = k1.pub, m2 = k1.pub without its final newline" "${SK[@]}" -F

    new_dir "$ver" dup1; put minions_pre m1 k1; put minions m1 k2
    watch_run "id pending (k1) and accepted (k2): list" "${SK[@]}" -L --out json
    watch_run "id pending (k1) and accepted (k2): print key" "${SK[@]}" -p m1
    watch_run "id pending (k1) and accepted (k2): accept" "${SK[@]}" -a m1 -y

    new_dir "$ver" dup2; put minions_rejected m1 k1; put minions m1 k2
    watch_run "id rejected (k1) and accepted (k2): list" "${SK[@]}" -L --out json
    watch_run "id rejected (k1) and accepted (k2): delete" "${SK[@]}" -d m1 -y

    new_dir "$ver" dup3; put minions_rejected m1 k1; put minions_pre m1 k2
    watch_run "id rejected (k1) and pending (k2): accept" "${SK[@]}" -a m1 -y
done
