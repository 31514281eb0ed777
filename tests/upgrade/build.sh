#!/usr/bin/env bash
# Builds the previous release (tests/upgrade/previous-release) from its
# commit, with that commit's own scripts/package.sh, once:
#
#     tests/upgrade/build.sh        # prints: VERSION COMMIT DEB BINARY
#
# Cached under ${CARGO_TARGET_DIR:-target}/previous-release/<commit>/: the
# commit's tree (git archive, no tag or work tree needed) and its own target
# folder (a release build: minutes on 2 cores the first time). The packaging
# tools of this tree's scripts/package.sh (target/package-tools/) are lent
# to it when they are the versions the old script pins; otherwise it
# installs its own. Fails, never skips, when the commit is not in this
# clone's history (a shallow clone: git fetch --unshallow).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac

die() { echo "previous-release: error: $*" >&2; exit 1; }

version=$(sed -n 's/^version=//p' "$here/previous-release")
commit=$(sed -n 's/^commit=//p' "$here/previous-release")
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ && "$commit" =~ ^[0-9a-f]{40}$ ]] \
    || die "$here/previous-release must hold version=X.Y.Z and commit=<40 hex digits>"
git -C "$repo" cat-file -e "$commit^{commit}" 2>/dev/null \
    || die "commit $commit (release $version) is not in this clone of $(git -C "$repo" remote get-url origin 2>/dev/null || echo "$repo"): the upgrade test builds the previous release from the repository's history; clone without --depth (or git fetch --unshallow)"

base="$target/previous-release"
dir="$base/$commit"
mkdir -p "$base"
exec {lock}>"$base/.lock"
flock "$lock"

if [ ! -f "$dir/complete" ]; then
    # Builds of other commits are of no more use (each is ~1 GB of target).
    find "$base" -mindepth 1 -maxdepth 1 -type d ! -name "$commit" -exec rm -rf {} +
    rm -rf "$dir"
    mkdir -p "$dir/src" "$dir/out"
    started=$SECONDS
    echo "previous-release: building $version ($commit) with its own scripts/package.sh, once: $dir" >&2
    git -C "$repo" archive "$commit" | tar -x -C "$dir/src"
    # The tools the old script pins, if this tree's are those versions.
    mkdir -p "$dir/src/target/package-tools/bin"
    for tool in cargo-deb cargo-generate-rpm; do
        if [ -x "$target/package-tools/bin/$tool" ]; then
            ln -s "$target/package-tools/bin/$tool" "$dir/src/target/package-tools/bin/$tool"
        fi
    done
    # Its script builds in its own tree's target/ (its paths are relative).
    if ! (cd "$dir/src" && env -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET_DIR ./scripts/package.sh) >"$dir/build.log" 2>&1; then
        tail -n 30 "$dir/build.log" >&2
        die "scripts/package.sh of $commit failed (log above; all of it in $dir/build.log)"
    fi
    debs=("$dir"/src/target/debian/*.deb)
    if [ ${#debs[@]} -ne 1 ] || [ ! -f "${debs[0]}" ]; then
        die "scripts/package.sh of $commit made no single .deb"
    fi
    cp "${debs[0]}" "$dir/out/"
    cp "$dir/src/target/release/salt-keysync" "$dir/out/salt-keysync"
    # Only the packages and the binary are needed again: the rest is gigabytes.
    rm -rf "$dir/src/target"
    said=$("$dir/out/salt-keysync" --version)
    [ "$said" = "salt-keysync $version" ] || [[ "$said" == "salt-keysync $version "* ]] \
        || die "the binary built from $commit says '$said', not salt-keysync $version"
    touch "$dir/complete"
    echo "previous-release: built in $((SECONDS - started)) s" >&2
fi
debs=("$dir"/out/*.deb)
echo "$version $commit ${debs[0]} $dir/out/salt-keysync"
