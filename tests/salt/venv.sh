#!/usr/bin/env bash
# Create (or reuse) Python virtualenvs holding real Salt, for the real-Salt tests.
#
# Usage:
#   tests/salt/venv.sh              # every supported version (3008.3, 3007.15, 3006.28)
#   tests/salt/venv.sh 3008.3       # only the named version(s)
#
# Venvs live in the build folder, never in the source tree:
#   ${CARGO_TARGET_DIR:-<repo>/target}/salt-venvs/<version>/
# so `<that dir>/bin/salt-key`, `bin/salt-master`, `bin/salt-minion` are the tools.
#
# stdout: one line per version, "<version> <venv dir>" (easy to parse);
# progress and timings go to stderr.
#
# Idempotent: an existing venv is reused when `<venv>/bin/salt-key --version`
# reports the expected version; a missing or broken one is deleted and re-created.
# Safe to run concurrently (one flock per version).
#
# Environment:
#   CARGO_TARGET_DIR      build folder (default <repo>/target)
#   SALT_VENV_PYTHON      interpreter to build the venvs with (default: python3, 3.11)
#   SALT_VENV_UNPINNED=1  ignore tests/salt/constraints-<version>.txt and let pip
#                         resolve the newest dependencies Salt allows
#   SALT_VENV_FORCE=1     re-create even when the venv looks healthy
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac   # cargo reads it relative to cwd
base="$target/salt-venvs"
python="${SALT_VENV_PYTHON:-python3}"

# One release of each supported Salt line (3007.15: see its constraints file).
supported=(3008.3 3007.15 3006.28)
if [ "$#" -gt 0 ]; then versions=("$@"); else versions=("${supported[@]}"); fi

log() { printf 'salt-venv: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v "$python" >/dev/null 2>&1 || die "no $python on PATH (set SALT_VENV_PYTHON)"
pyver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$pyver" = "3.11" ] || log "warning: $python is Python $pyver; these venvs were verified with 3.11"
"$python" -c 'import venv, ensurepip' 2>/dev/null \
    || die "$python lacks venv/ensurepip (Debian: apt-get install python3-venv)"

mkdir -p "$base"

# A venv is healthy when its salt-key runs and reports exactly the wanted version
# (e.g. "salt-key 3008.3 (Argon)"). This also catches a venv whose base
# interpreter has gone away.
healthy() {
    local venv="$1" ver="$2" out
    [ -f "$venv/.salt-keysync-ok" ] || return 1
    [ -x "$venv/bin/salt-key" ] || return 1
    out="$("$venv/bin/salt-key" --version 2>/dev/null)" || return 1
    [[ "$out" == "salt-key $ver "* ]]
}

create() {
    local venv="$1" ver="$2" started=$SECONDS
    local logfile="$base/$ver.install.log"
    local -a pins=()
    if [ -z "${SALT_VENV_UNPINNED:-}" ] && [ -f "$here/constraints-$ver.txt" ]; then
        pins=(-c "$here/constraints-$ver.txt")
    fi
    log "creating salt $ver in $venv (log: $logfile)"
    rm -rf "$venv"
    : >"$logfile"
    if ! "$python" -m venv "$venv" >>"$logfile" 2>&1 \
        || ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            --no-input "${pins[@]}" "salt==$ver" >>"$logfile" 2>&1; then
        tail -n 40 "$logfile" >&2 || true
        rm -rf "$venv"
        die "installing salt==$ver failed (see $logfile)"
    fi
    touch "$venv/.salt-keysync-ok"
    if ! healthy "$venv" "$ver"; then
        "$venv/bin/salt-key" --version >&2 || true
        rm -rf "$venv"
        die "salt==$ver installed but salt-key --version does not report $ver"
    fi
    log "salt $ver ready in $((SECONDS - started)) s"
}

for ver in "${versions[@]}"; do
    [[ "$ver" =~ ^[0-9]+(\.[0-9]+)*$ ]] || die "not a Salt version: '$ver'"
    case " ${supported[*]} " in
        *" $ver "*) ;;
        *) log "warning: salt $ver is not one of the verified versions (${supported[*]})" ;;
    esac
    venv="$base/$ver"
    exec {lock}>"$base/.$ver.lock"
    flock "$lock"
    if [ -n "${SALT_VENV_FORCE:-}" ] || ! healthy "$venv" "$ver"; then
        if [ -n "${SALT_VENV_FORCE:-}" ]; then log "salt $ver: SALT_VENV_FORCE set, re-creating"
        elif [ -e "$venv" ]; then log "salt $ver: venv in $venv is broken, re-creating"; fi
        create "$venv" "$ver"
    else
        log "salt $ver: reusing $venv"
    fi
    flock -u "$lock"
    exec {lock}>&-
    printf '%s %s\n' "$ver" "$venv"
done
