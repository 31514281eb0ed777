#!/usr/bin/env bash
# Builds the salt-keysync packages from a clean clone, in one command:
#
#     ./scripts/package.sh      # → target/debian/*.deb and target/generate-rpm/*.rpm
#
# Needs only cargo (and gcc, as the rest of the build): the two packaging
# tools are installed at pinned versions with `cargo install --locked` into
# target/package-tools/ the first time (a few minutes of compiling on 2
# cores, then cached). Then: release build, man pages and shell completions
# rendered by the binary itself (`salt-keysync generate`), and both packages
# from the metadata in agent/Cargo.toml. ./scripts/check-packages.sh checks
# what they contain.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CARGO_DEB_VERSION=3.8.0
CARGO_GENERATE_RPM_VERSION=0.21.1
TOOLS="$PWD/target/package-tools"
ASSETS=target/release/package-assets
export PATH="$TOOLS/bin:$PATH"

# Installs cargo-NAME@VERSION into $TOOLS unless that version is there.
install_tool() {
    local name=$1 version=$2
    if "$TOOLS/bin/$name" --version 2>/dev/null | grep -qF "$version"; then
        return
    fi
    echo "== cargo install $name@$version (once; cached in $TOOLS)"
    # One shared build folder: the two tools have dependencies in common.
    # opt-level 1 (cargo-deb's own choice for its release profile) compiles
    # cargo-generate-rpm's many crypto dependencies faster than the default
    # 3, and both tools only pack a few megabytes.
    CARGO_PROFILE_RELEASE_OPT_LEVEL=1 \
        cargo install --quiet --locked --root "$TOOLS" --target-dir "$TOOLS/build" "$name@$version"
}
install_tool cargo-deb "$CARGO_DEB_VERSION"
install_tool cargo-generate-rpm "$CARGO_GENERATE_RPM_VERSION"
rm -rf "$TOOLS/build"

echo "== cargo build --release"
cargo build --release --locked -p salt-keysync
# Debug info out, symbols kept (backtraces still name functions); the .deb
# and the .rpm then ship the same bytes.
strip --strip-debug target/release/salt-keysync

echo "== man pages and completions"
rm -rf "$ASSETS"
target/release/salt-keysync generate man "$ASSETS/man"
gzip -9n "$ASSETS"/man/*.1
for shell in bash zsh fish; do
    target/release/salt-keysync generate completions "$shell" "$ASSETS/completions"
done

echo "== .deb"
rm -f target/debian/*.deb
cargo deb -p salt-keysync --no-build --no-strip
echo "== .rpm"
rm -f target/generate-rpm/*.rpm
cargo generate-rpm -p agent

ls -l target/debian/*.deb target/generate-rpm/*.rpm
