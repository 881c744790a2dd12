#!/usr/bin/env bash
# Instructions the sidecar spends per state GET, counted by callgrind
# (exact and repeatable, whatever else the machine is doing), for each
# `rewire` binary given: HTTP (`h2load --h1`) and gRPC `GetState` (`h2load`),
# 8 connections, against a redis store on a private redis-server; and, for
# scale, gRPC `SaveState` of a one-byte value.
#
#   scripts/bench/instructions-per-get.sh target/release/rewire [OTHER_BINARY...]
#
# Each binary runs twice per protocol under callgrind, with N requests and
# with none; (total(N) - total(0)) / N is the cost of one GET, start-up and
# shutdown cancelled out. Needs valgrind, h2load (nghttp2-client) and
# redis-server. REWIRE_GETS sets N (default 4000); REWIRE_PRELOAD is put in
# LD_PRELOAD of the sidecar (to try another allocator).
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,14p' "$0"; exit 2; }
gets=${REWIRE_GETS:-4000}
work=$(mktemp -d)
trap 'redis-cli -p 6391 shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
redis-server --port 6391 --save "" --daemonize yes --logfile "$work/redis.log" >/dev/null
cat > "$work/rewire.json" <<JSON
{"appId":"bench","components":{"state":{"store":{"type":"redis","metadata":{"redisHost":"127.0.0.1:6391"}}}}}
JSON
# GetStateRequest{store_name: "store", key: "k1"} in a gRPC frame.
printf '\x00\x00\x00\x00\x0b\x0a\x05store\x12\x02k1' > "$work/get.bin"
# SaveStateRequest{store_name: "store", states: [{key: "k2", value: "v"}]}.
printf '\x00\x00\x00\x00\x10\x0a\x05store\x12\x07\x0a\x02k2\x12\x01v' > "$work/save.bin"

# Total instructions of one sidecar run serving `count` GETs over `proto`.
instructions() {
  local bin=$1 proto=$2 count=$3 out="$work/callgrind.out" log="$work/sidecar.log"
  env ${REWIRE_PRELOAD:+LD_PRELOAD=$REWIRE_PRELOAD} valgrind --tool=callgrind \
    --callgrind-out-file="$out" "$bin" run --workers 1 -c "$work/rewire.json" \
    --http-addr 127.0.0.1:3591 --grpc-addr 127.0.0.1:50091 > "$log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 240); do grep -q "listening" "$log" && break; sleep 0.5; done
  curl -sf -XPOST 127.0.0.1:3591/v1.0/state/store -H 'content-type: application/json' \
    -d '[{"key":"k1","value":{"zeta":1,"alpha":2.50}}]'
  if [ "$count" -gt 0 ]; then
    if [ "$proto" = http ]; then
      h2load --h1 -t1 -c8 -n "$count" http://127.0.0.1:3591/v1.0/state/store/k1
    else
      local method=GetState body=get.bin
      [ "$proto" = grpc-save ] && method=SaveState body=save.bin
      h2load -t1 -c8 -m1 -n "$count" -d "$work/$body" -H 'content-type: application/grpc' \
        -H 'te: trailers' "http://127.0.0.1:50091/dapr.proto.runtime.v1.Dapr/$method"
    fi > "$work/h2load.log"
    grep -q " $count succeeded" "$work/h2load.log" || { cat "$work/h2load.log" "$log" >&2; exit 1; }
  fi
  kill -INT "$pid"
  wait "$pid" || true
  awk '/^(summary|totals):/ {print $2; exit}' "$out"
}

printf '| binary | HTTP GET | gRPC GetState | gRPC SaveState |\n| --- | --- | --- | --- |\n'
for bin in "$@"; do
  row="| \`$bin\`"
  for proto in http grpc grpc-save; do
    none=$(instructions "$bin" "$proto" 0)
    some=$(instructions "$bin" "$proto" "$gets")
    row="$row | $(( (some - none) / gets ))"
  done
  echo "$row |"
done
echo "(instructions per call, user space: the sidecar and the libraries it links; $gets calls, 8 connections)"
