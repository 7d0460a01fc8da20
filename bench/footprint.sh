#!/usr/bin/env bash
# lifeguard's idle memory beside a real Envoy 1.40 (config/envoy-bootstrap.yaml,
# 2 clusters), as shipped (scripts/release: dist/lifeguard): RSS and what it
# is made of (heap and stacks = anonymous; the binary's and libc's pages =
# file-backed, shared with every process mapping the same files), after:
#   start (Envoy ready, 2 s idle), 3 merged scrapes, 100 merged scrapes
#   (gzip), 100,000 probes (bench/loadgen.rs at 20,000/s), each followed by
#   2 s idle.
# Usage: bench/footprint.sh [RUNS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
ENVOY=$(scripts/envoy-bin)
scripts/release >/dev/null
cargo build --profile dist --quiet --example loadgen
BIN=dist/lifeguard

# Ports 31200-31299, below the ephemeral range; refuse to run if taken.
ADMIN=31200; STATUS=31221; AGENT=31220; INBOUND=31206; APP=31280; PROM=31290
for p in $ADMIN $STATUS $AGENT $INBOUND $APP $PROM; do
  if (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "port $p is in use" >&2; exit 1; fi
done
work=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
. bench/lib.sh
remap_bootstrap "$work/envoy.yaml" $ADMIN $STATUS $AGENT $INBOUND $APP $PROM

kib() { awk -v k="$1" '$1 == k":" {s += $2} END {print s + 0}' "/proc/$pid/smaps_rollup"; }
row() { # label
  local rss anon file
  rss=$(kib Rss); anon=$(kib Anonymous); file=$((rss - anon))
  printf '%-22s %8.2f %8.2f %8.2f %8s\n' "$1" "$(awk -v k="$rss" 'BEGIN {print k / 1024}')" \
    "$(awk -v k="$anon" 'BEGIN {print k / 1024}')" "$(awk -v k="$file" 'BEGIN {print k / 1024}')" "$(ls "/proc/$pid/task" | wc -l)"
}
scrape() { for _ in $(seq 1 "$1"); do curl -s -H 'Accept-Encoding: gzip' "http://127.0.0.1:$AGENT/stats/prometheus" -o /dev/null; done; }

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) CPUs; $BIN $(stat -c %s $BIN) bytes; MiB"
for run in $(seq 1 "$RUNS"); do
  printf '\n## run %s\n%-22s %8s %8s %8s %8s\n' "$run" when RSS heap files threads
  LIFEGUARD_LOG=warn "$BIN" run --status-addr 127.0.0.1:$AGENT --admin-url http://127.0.0.1:$ADMIN -- \
    "$ENVOY" -c "$work/envoy.yaml" --disable-hot-restart -l error --concurrency 1 >"$work/lifeguard.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$AGENT/healthz/ready" || true)" = 200 ] && break
    sleep 0.1
  done
  sleep 2; row "after start"
  scrape 3; sleep 2; row "after 3 scrapes"
  scrape 97; sleep 2; row "after 100 scrapes"
  target/dist/examples/loadgen "http://127.0.0.1:$AGENT/healthz/ready" 20000 5 4 >/dev/null; sleep 2; row "after 100,000 probes"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
done
