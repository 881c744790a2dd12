#!/usr/bin/env bash
# Compares two lists of test names made with
#   cargo test --workspace --all-targets --features etcd -- --list
# (one "name: test" line each, sorted), ignoring the module prefix a test
# gained when its file became a module of a test binary (`reload_add::`,
# `api_grpc_auth::`, ...). Prints the names in one list only; exit 1 if any.
set -euo pipefail
before=${1:-/work/test-names-before.txt}
after=${2:-/work/test-names-after.txt}
# Module prefixes in the after list are the names of the files that became
# modules (tests/<area>/<file>.rs, components/tests/components/<file>.rs,
# runtime/tests/<area>/<file>.rs).
cd "$(dirname "$0")/.."
prefixes=$(ls tests/*/*.rs components/tests/*/*.rs runtime/tests/*/*.rs \
  | xargs -n1 basename | sed 's/\.rs$//' | grep -v '^main$' | sort -u | paste -sd'|')
strip() { sed -E "s/^(${prefixes})::(.*)$/\2/" "$1" | sort; }
if diff <(sort "$before") <(strip "$after"); then
  echo "same $(wc -l < "$before") tests before and after (module prefixes stripped)"
else
  exit 1
fi
