#!/usr/bin/env bash
# What one probe costs the server in CPU time, counted by `perf stat`
# (task-clock: the time the server's threads ran) on the server process
# while wrk probes it: unlike requests a second, it leaves out the time the
# server waited for wrk (a neighbour slowing the client), so two builds
# compare better on a shared machine. (Where the machine exposes hardware
# counters, instructions would be steadier still; this one's virtual CPUs
# do not.) In one
# run, alternating (a b c a b c ...):
#   a. lifeguard GET /healthz/ready (ready; its Envoy is a real Envoy 1.40
#      started from config/envoy-bootstrap.yaml)
#   b. with BASELINE=PATH: another lifeguard binary (an earlier commit's)
#   c. bare-hyper: a bare hyper 1.x server answering a static 200, the same
#      dist profile (what ships): the floor for this stack
# Servers on CPU 0, wrk (one thread) on CPU 1; keep-alive, then a new
# connection per probe. Per round and server: CPU nanoseconds per request
# (task-clock over wrk's request count) and requests a second; then the
# medians of the rounds and the ratios a/b and a/c.
#
# Usage: [LIFEGUARD=path] [BASELINE=path] bench/probe_cost.sh [SECONDS_PER_RUN=5] [ROUNDS=5] [CONNECTIONS=32]
#   LIFEGUARD: default target/dist/lifeguard (built here); give
#   dist/lifeguard (scripts/release) to compare with a baseline built the
#   same way. BARE_HYPER: a bare-hyper binary already built (default:
#   built here, target/dist/examples/bare-hyper). Needs perf (Debian: linux-perf) and root or
#   kernel.perf_event_paranoid <= 1 for the kernel's share.
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-5}
R=${2:-5}
C=${3:-32}
command -v perf >/dev/null || { echo "bench/probe_cost.sh: perf is needed (apt-get install linux-perf)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "bench/probe_cost.sh: wrk is needed (apt-get install wrk)" >&2; exit 1; }
ENVOY=$(scripts/envoy-bin)
BARE_HYPER=${BARE_HYPER:-}
if [ -z "${LIFEGUARD:-}" ]; then
  cargo build --profile dist --quiet --bin lifeguard
  LIFEGUARD=target/dist/lifeguard
fi
if [ -z "$BARE_HYPER" ]; then
  cargo build --profile dist --quiet --example bare-hyper
  BARE_HYPER=target/dist/examples/bare-hyper
fi

# Ports 31100-31199 (bench/load.sh has 31000-31099); refuse to run if taken.
ADMIN=31100; STATUS=31121; AGENT=31120; INBOUND=31106; APP=31180; PROM=31190; BARE=31181; BASE=31122
. bench/lib.sh
bench_start $ADMIN $STATUS $AGENT $INBOUND $APP $PROM $BARE $BASE

remap_bootstrap "$work/envoy.yaml" $ADMIN $STATUS $AGENT $INBOUND $APP $PROM
taskset -c 1 "$ENVOY" -c "$work/envoy.yaml" --disable-hot-restart -l error --concurrency 1 >"$work/envoy.log" 2>&1 & pids+=($!)
declare -A PID URL
LIFEGUARD_LOG=warn taskset -c 0 "$LIFEGUARD" run --status-addr 127.0.0.1:$AGENT --admin-url http://127.0.0.1:$ADMIN >"$work/lifeguard.log" 2>&1 &
pids+=($!); PID[lifeguard]=$!; URL[lifeguard]=http://127.0.0.1:$AGENT/healthz/ready
SERVERS="lifeguard"
if [ -n "${BASELINE:-}" ]; then
  LIFEGUARD_LOG=warn taskset -c 0 "$BASELINE" run --status-addr 127.0.0.1:$BASE --admin-url http://127.0.0.1:$ADMIN >"$work/baseline.log" 2>&1 &
  pids+=($!); PID[baseline]=$!; URL[baseline]=http://127.0.0.1:$BASE/healthz/ready
  SERVERS="$SERVERS baseline"
fi
taskset -c 0 "$BARE_HYPER" 127.0.0.1:$BARE >"$work/bare.log" 2>&1 &
pids+=($!); PID[bare-hyper]=$!; URL[bare-hyper]=http://127.0.0.1:$BARE/healthz/ready
SERVERS="$SERVERS bare-hyper"

for s in $SERVERS; do
  ok=""
  for _ in $(seq 1 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "${URL[$s]}" || true)" = 200 ] && { ok=1; break; }
    sleep 0.1
  done
  [ -n "$ok" ] || { echo "${URL[$s]} never answered 200" >&2; cat "$work"/*.log >&2; exit 1; }
done

# One run: wrk on the server for D s while perf counts the server's CPU
# time; prints "requests task_clock_ms requests_per_second".
measure() { # server mode
  local extra=() out
  [ "$2" = close ] && extra=(-H "Connection: close")
  perf stat -x, -e task-clock -p "${PID[$1]}" -o "$work/perf.csv" &
  local perf_pid=$!
  sleep 0.2
  out=$(taskset -c 1 wrk -t1 -c"$C" -d"${D}s" "${extra[@]}" "${URL[$1]}")
  kill -INT "$perf_pid"
  wait "$perf_pid" || true
  local requests rps errors
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  errors=$(awk '/Non-2xx|Socket errors/' <<<"$out" | tr '\n' ' ')
  [ -n "$errors" ] && echo "  $1 $2: $errors" >&2
  awk -F, -v n="$requests" -v rps="$rps" '$3 == "task-clock" { t = $1 } END { print n, t, rps }' "$work/perf.csv"
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) CPUs; wrk -t1 -c$C -d${D}s, $R rounds, servers on CPU 0, wrk on CPU 1"
declare -A NS RPS
med() { tr ' ' '\n' <<<"$1" | grep . | median; }
for mode in keepalive close; do
  printf '\n## %s\n%-6s %-10s %10s %14s %10s\n' "$mode" round server requests cpu_ns/request req/s
  for r in $(seq 1 "$R"); do
    for s in $SERVERS; do
      read -r n t rps < <(measure "$s" "$mode")
      ns=$(awk -v t="$t" -v n="$n" 'BEGIN {printf "%.0f", t * 1e6 / n}')
      NS[$mode,$s]+="$ns "; RPS[$mode,$s]+="$rps "
      printf '%-6s %-10s %10s %14s %10.0f\n' "$r" "$s" "$n" "$ns" "$rps"
    done
  done
  for s in $SERVERS; do
    printf 'median %-10s %6s CPU ns a request (rounds: %s), %8.0f req/s\n' "$s" \
      "$(med "${NS[$mode,$s]}")" "$(tr ' ' '\n' <<<"${NS[$mode,$s]}" | grep . | paste -sd, -)" "$(med "${RPS[$mode,$s]}")"
  done
  ratio() { # a b: the ratio of their median CPU per request
    awk -v a="$(med "${NS[$mode,$1]}")" -v b="$(med "${NS[$mode,$2]}")" -v x="$1" -v y="$2" \
      'BEGIN {printf "CPU a request, %s / %s = %.3f\n", x, y, a / b}'
  }
  [ -n "${BASELINE:-}" ] && ratio lifeguard baseline
  ratio lifeguard bare-hyper
done
