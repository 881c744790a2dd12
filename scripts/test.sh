#!/usr/bin/env bash
# Runs rewire's whole test suite on a fresh machine: installs what the tests
# need when missing (redis-server, etcd-server, the Dapr Python SDK for the
# SDK compatibility test, the mermaid parser for the graph test), then runs
# every test of every crate. Building needs nothing beyond cargo and a C
# compiler: every proto (Dapr's, etcd's) compiles with protox.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
if [ ${#need[@]} -gt 0 ]; then
  echo "Installing ${need[*]}..."
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! python3 -c "import dapr.clients" >/dev/null 2>&1; then
  echo "Installing the Dapr Python SDK..."
  python3 -m pip install --quiet --disable-pip-version-check dapr
fi

if [ ! -d tests/mermaid/node_modules/mermaid ]; then
  echo "Installing the mermaid parser (for the graph test)..."
  npm install --prefix tests/mermaid --no-audit --no-fund --silent
fi

# A user's own sidecar binary, outside the workspace (tests/cli/embedded.rs
# runs it); built into the workspace's target directory to reuse its build.
target_dir=${CARGO_TARGET_DIR:-target}
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
cargo build -j2 --manifest-path examples/embedded-sidecar/Cargo.toml --target-dir "$target_dir"
export REWIRE_EMBEDDED_BIN="$target_dir/debug/greeter-sidecar"

cargo test --workspace --all-targets --no-fail-fast -j2 "$@"
# Documentation examples (`--all-targets` leaves doctests out).
cargo test --workspace --doc -j2 2>&1 | tee "$target_dir/doctests.log"
echo "Compiled documentation: $(grep -c '^test .* - .* ok$' "$target_dir/doctests.log") doctests passed;" \
  "$(cargo test --test cli -j2 -q -- docs_compile --nocapture 2>/dev/null | grep -o '[0-9]* Rust blocks of the docs are compiled as examples')."
# Every crate packages for crates.io, in dependency order (no upload).
cargo package --workspace --exclude testkit --no-verify --quiet
