#!/usr/bin/env bash
# Instructions and cache misses per component of validation (`validate`)
# and start-up (`Runtime::start`) at 1,000 and 10,000 components, counted by
# callgrind's cache simulation: exact and repeatable, whatever else the
# machine is doing, where the scaling table's times swing with the
# neighbours' share of the caches.
#
#   scripts/bench/scaling-misses.sh RELOAD_BENCH_BINARY [OTHER_BINARY...]
#
# The binary is a build of `benches/reload` (`cargo bench --bench reload
# --no-run` prints its path). It runs the smoke pass of the scaling section
# (REWIRE_BENCH_ONLY=scaling), in which each size validates and starts its
# configuration twice. The simulated last-level cache is 1 MiB, one core's
# L2 on this machine: "L2 misses" are reads that leave the core's own
# caches. Growth ×10 is linear. Needs valgrind.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,15p' "$0"; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Calls of each counted function per size in the smoke pass (the timed one
# and the one the bench keeps).
calls=2

# "instructions L2-read-misses" inside `symbol` for `n` components (all
# calls together).
count() {
  local bin=$1 n=$2 symbol=$3 out="$work/callgrind.out"
  REWIRE_BENCH_ONLY=scaling REWIRE_BENCH_SIZES=$n valgrind --tool=callgrind \
    --cache-sim=yes --LL=1048576,16,64 --toggle-collect="$symbol" \
    --callgrind-out-file="$out" "$bin" > /dev/null 2>&1
  # The summary line's events, in the order of the `events:` line.
  awk '/^events:/ { for (i = 2; i <= NF; i++) at[$i] = i - 1 }
       /^summary:/ { print $(at["Ir"] + 1), $(at["DLmr"] + 1) }' "$out"
}

row() { printf '| %-8s | %-10s | %-12s | %-9s | %-13s | %-9s |\n' "$@"; }

for bin in "$@"; do
  echo "## $bin"
  row counted components instructions "L2 misses" "(×growth)" "(×growth)"
  row --- --- --- --- --- ---
  for what in validate start; do
    case $what in
      validate) symbol='rewire_runtime::config::validate::validate' ;;
      start) symbol='rewire_runtime::runtime::Runtime::start::*' ;;
    esac
    prev_ir='' prev_miss=''
    for n in 1000 10000; do
      read -r ir miss < <(count "$bin" "$n" "$symbol")
      # Per component per call.
      per_ir=$(awk -v v="$ir" -v n="$n" -v c=$calls 'BEGIN { printf "%.0f", v / n / c }')
      per_miss=$(awk -v v="$miss" -v n="$n" -v c=$calls 'BEGIN { printf "%.1f", v / n / c }')
      grow_ir='' grow_miss=''
      if [ -n "$prev_ir" ]; then
        grow_ir=$(awk -v a="$ir" -v b="$prev_ir" 'BEGIN { printf "×%.1f", a / b }')
        grow_miss=$(awk -v a="$miss" -v b="$prev_miss" 'BEGIN { printf "×%.1f", a / b }')
      fi
      row "$what" "$n" "$per_ir" "$per_miss" "$grow_ir" "$grow_miss"
      prev_ir=$ir prev_miss=$miss
    done
  done
done
