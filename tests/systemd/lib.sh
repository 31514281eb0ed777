# Helpers of tests/systemd/run.sh (sourced): checks that count, polling with
# a deadline, the container (systemd-nspawn without a host systemd), and the
# salt-keysync agents and salt-key runs outside it.

n_checks=0
started_at=$SECONDS

step() { printf '== %s\n' "$*"; }
ok() {
    n_checks=$((n_checks + 1))
    printf 'ok   %s\n' "$*"
}
# Ends the test: the reason, what the agents said, then the summary line.
fail() {
    printf 'FAIL %s\n' "$*"
    diagnostics >&2 || true
    printf 'systemd-test: FAIL: %s (after %d checks, %d s)\n' "$*" "$n_checks" $((SECONDS - started_at))
    exit 1
}

# eventually SECONDS WHAT COMMAND...: runs COMMAND every 0.2 s until it
# succeeds; fails the test with WHAT and COMMAND's last output otherwise.
eventually() {
    local limit=$1 what=$2 deadline out
    shift 2
    deadline=$((SECONDS + limit))
    while true; do
        if out=$("$@" 2>&1); then
            return 0
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            fail "$what: not within $limit s (last: $(printf '%s' "$out" | tail -n 5))"
        fi
        sleep 0.2
    done
}

# ---- the container ----

# Every cgroup hierarchy systemd-nspawn uses: the unified one and, on a
# hybrid host, systemd's named v1 hierarchy.
cgroup_roots() {
    if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
        echo /sys/fs/cgroup
    else
        for root in /sys/fs/cgroup/unified /sys/fs/cgroup/systemd; do
            [ -d "$root" ] && echo "$root"
        done
    fi
    return 0
}

# boot ROOTFS SHARE: boots ROOTFS (changes go to a tmpfs and vanish at
# shutdown) with SHARE read-only at /srv/keysync, in a cgroup of its own.
# Without a host systemd: no registration with machined, no scope unit, and
# nspawn's /run/systemd/nspawn on a tmpfs in a private mount namespace.
boot() {
    local rootfs=$1 share=$2 root
    cgroup_name="salt-keysync-systemd-test-$$"
    for root in $(cgroup_roots); do
        mkdir -p "$root/$cgroup_name"
    done
    CGROUP_NAME=$cgroup_name CGROUP_ROOTS="$(cgroup_roots)" \
        unshare --mount --propagation private bash -c '
            for root in $CGROUP_ROOTS; do echo $$ >"$root/$CGROUP_NAME/cgroup.procs"; done
            mkdir -p /run/systemd/nspawn
            mount -t tmpfs tmpfs /run/systemd/nspawn
            exec systemd-nspawn --quiet --register=no --keep-unit --boot --volatile=overlay \
                --directory="$0" --machine=master-a --console=passive --bind-ro="$1:/srv/keysync"
        ' "$rootfs" "$share" >"$work/nspawn.log" 2>&1 {lock}>&- &
    nspawn_pid=$!
    eventually 30 "systemd-nspawn started the container's systemd" find_leader
    leader=$(find_leader)
    eventually 30 "the container's systemd listens" test -S "$(in_root /run/systemd/private)"
    local state
    state=$(inside systemctl is-system-running --wait 2>&1) || true
    [ "$state" = running ] || fail "the container's systemd is '$state': $(inside systemctl --failed --no-legend 2>&1)"
}

# The container's PID 1, as seen from the host.
find_leader() {
    local pid
    pid=$(pgrep -P "$nspawn_pid" | head -n 1)
    [ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe")" != "$(readlink "/proc/$nspawn_pid/exe")" ] && echo "$pid"
}

# inside [--no-terminal] COMMAND...: runs COMMAND in the container as its
# root, with a clean environment, in /srv/keysync; --no-terminal: in a
# session of its own, without the controlling terminal of the test's.
inside() {
    local session=()
    if [ "$1" = --no-terminal ]; then
        session=(setsid --wait)
        shift
    fi
    "${session[@]}" nsenter --target "$leader" --all \
        env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        sh -c 'cd /srv/keysync && exec "$@"' sh "$@"
}

# The container's file system, read from the host (cheap enough to poll).
in_root() { printf '/proc/%s/root%s' "$leader" "$1"; }

shutdown_container() {
    [ -n "${nspawn_pid:-}" ] || return 0
    if kill -0 "$nspawn_pid" 2>/dev/null; then
        # nspawn turns SIGTERM into a clean poweroff of the container.
        kill -TERM "$nspawn_pid" 2>/dev/null || true
        local deadline=$((SECONDS + 30))
        while kill -0 "$nspawn_pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
        kill -KILL "$nspawn_pid" 2>/dev/null || true
        wait "$nspawn_pid" 2>/dev/null || true
    fi
    nspawn_pid=
    # The container's systemd leaves its (empty) cgroups behind.
    local root
    for root in $(cgroup_roots); do
        [ -d "$root/$cgroup_name" ] && find "$root/$cgroup_name" -depth -type d -exec rmdir {} + 2>/dev/null
    done
    return 0
}

# doc_block NAME: the block after `<!-- systemd-test: NAME -->` in the docs
# (README.md, SECURITY.md, ARCHITECTURE.md, docs/*.md: marked once in them
# all), run verbatim in the container by `run_doc_block`. Read by the one
# reader of the docs-as-tests, tests/src/docs.rs, as the cargo tests read
# every block: its `doc-block` program, compiled with rustc alone (std only,
# a second) into $work once; it names the reason when there is no block.
doc_block() {
    local reader="$work/doc-block" build
    if [ ! -x "$reader" ]; then
        # Built in a folder of its own, then renamed: a block read in the
        # background meanwhile never runs a half-written program.
        build=$(mktemp -d "$work/doc-block.XXXXXX") || return 1
        CARGO_MANIFEST_DIR="$repo/tests" rustc --edition 2021 --crate-name doc_block -o "$build/doc-block" \
            "$repo/tests/src/bin/doc_block.rs" && mv -f "$build/doc-block" "$reader"
        rm -rf "$build"
        [ -x "$reader" ] || return 1
    fi
    "$reader" "systemd-test: $1"
}

# run_doc_block NAME [FOLDER]: runs the block in /srv/keysync/FOLDER as root,
# as automation would: no terminal (a session of its own) and nothing on
# stdin, so a command that would ask a question fails instead.
run_doc_block() {
    local name=$1 folder=${2:-.} block
    block=$(doc_block "$name" 2>"$work/doc-$name.err") || fail "the docs' '$name' block: $(cat "$work/doc-$name.err")"
    printf '%s\n' "$block" | sed 's/^/     $ /'
    inside --no-terminal sh -euc "cd '/srv/keysync/$folder'; $block" </dev/null >"$work/doc-$name.out" 2>&1 \
        || fail "the docs' '$name' commands failed in the container: $(tail -n 15 "$work/doc-$name.out")"
    ok "the docs' '$name' commands, verbatim"
}

# ---- the agents and Salt outside the container ----

# peer_setup NAME ADDRESS: a master's pki_dir, master config (for salt-key),
# and agent config under $work/NAME, with master-a and the other master
# outside as its peers (every master lists every other: a decision whose
# origin is no master of the site is refused).
peer_setup() {
    local name=$1 address=$2 dir="$work/$1" other other_address
    if [ "$name" = master-b ]; then other=master-c other_address=$C_ADDR; else other=master-b other_address=$B_ADDR; fi
    mkdir -p "$dir/pki/minions" "$dir/pki/minions_pre" "$dir/pki/minions_rejected" "$dir/cache" "$dir/sock"
    chmod 0700 "$dir" "$dir/pki" "$dir/cache"
    # Salt's multi-master: every master has the same key pair.
    inside cat /etc/salt/pki/master/master.pub >"$dir/pki/master.pub"
    cat >"$dir/master" <<EOF
id: $name
root_dir: $dir
pki_dir: $dir/pki
cachedir: $dir/cache
sock_dir: $dir/sock
pidfile: $dir/master.pid
log_file: $dir/master.log
key_logfile: $dir/key.log
user: root
EOF
    cat >"$dir/config.toml" <<EOF
node = "$name"
pki_dir = "$dir/pki"
state_dir = "$dir/state"
listen = "$address"
audit_log = "$dir/audit.jsonl"

[tls]
ca = "$work/tls/ca.pem"
cert = "$work/tls/$name.pem"
key = "$work/tls/$name.key"

[[peer]]
name = "master-a"
address = "$A_IP:4515"

[[peer]]
name = "$other"
address = "$other_address"

[salt]
master_config = "$dir/master"
cachedir = "$dir/cache"
master_id = "${name}_master"
user = "root"
EOF
    chmod 0600 "$dir/config.toml" "$dir/master"
}

# peer_start NAME: its agent, a real process of the same build as the .deb.
peer_start() {
    local name=$1
    SALT_KEYSYNC_LOG=info "$bin" run --config "$work/$name/config.toml" >>"$work/$name/agent.log" 2>&1 {lock}>&- &
    eval "pid_${name//-/_}=$!"
}

peer_stop() {
    local var="pid_${1//-/_}"
    if [ -n "${!var:-}" ]; then
        kill -TERM "${!var}" 2>/dev/null || true
        wait "${!var}" 2>/dev/null || true
        eval "$var="
    fi
}

# salt_key_on NAME ARGS...: the real salt-key of Salt 3008.3 on that master.
salt_key_on() {
    local name=$1
    shift
    "$salt_venv/bin/salt-key" -c "$work/$name" -y "$@" >>"$work/$name/salt-key.log" 2>&1
}

# folder_of ROOT ID: which key folder of the pki_dir ROOT holds ID.
folder_of() {
    local folder
    for folder in minions minions_pre minions_rejected; do
        if [ -e "$1/$folder/$2" ]; then
            echo "$folder"
            return 0
        fi
    done
    echo absent
}

# expect_folder WHERE ROOT ID FOLDER: ID is in FOLDER of that pki_dir.
expect_folder() {
    [ "$(folder_of "$2" "$3")" = "$4" ] || { echo "$3 is in $(folder_of "$2" "$3") on $1, not $4"; return 1; }
}

# What to show when a check fails.
diagnostics() {
    echo "---- diagnostics"
    if [ -n "${leader:-}" ] && kill -0 "$leader" 2>/dev/null; then
        echo "-- systemctl status salt-keysync salt-master (container)"
        inside systemctl --no-pager --full status salt-keysync salt-master 2>&1 | tail -n 40
        echo "-- journalctl -u salt-keysync (container, last 60)"
        inside journalctl --no-pager -u salt-keysync -n 60 2>&1
    fi
    local name
    for name in master-b master-c; do
        [ -f "$work/$name/agent.log" ] || continue
        echo "-- $name agent (host, last 30)"
        tail -n 30 "$work/$name/agent.log"
    done
}
