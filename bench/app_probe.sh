#!/usr/bin/env bash
# The cost of an app probe through lifeguard, side by side with the same
# probe made directly, as the kubelet makes it: one connection per probe
# (`Connection: close`), one at a time (wrk -c1), alternating rounds:
#   direct:   GET /healthz/ready on the app (bench/bare_hyper.rs)
#   lifeguard: GET /app-health/app/readyz on lifeguard, which runs the same
#             httpGet against the app (a new connection from 127.0.0.6)
# The app and lifeguard on CPU 0, wrk on CPU 1. Then the same with 8
# concurrent probers (the calls of one path are capped at 4 at once, so
# this also shows the cap's queueing).
#
# Usage: bench/app_probe.sh [SECONDS_PER_RUN=5] [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-5}
R=${2:-3}

sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
if ! command -v wrk >/dev/null 2>&1; then
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends wrk >/dev/null
fi
cargo build --profile dist --quiet --bin lifeguard --example bare-hyper

# Ports 31500-31599, below the ephemeral range; refuse to run if taken.
APP=31580; AGENT=31520; NOADMIN=31500
. bench/lib.sh
bench_start $APP $AGENT

PROBES="{\"/app-health/app/readyz\":{\"httpGet\":{\"path\":\"/healthz/ready\",\"port\":$APP},\"timeoutSeconds\":1}}"
taskset -c 0 target/dist/examples/bare-hyper 127.0.0.1:$APP >"$work/app.log" 2>&1 & pids+=($!)
# No Envoy: its readiness is not what is measured (the admin URL answers nothing).
LIFEGUARD_LOG=warn taskset -c 0 target/dist/lifeguard run --status-addr 127.0.0.1:$AGENT \
  --admin-url http://127.0.0.1:$NOADMIN --pod-ip 127.0.0.1 --app-probers "$PROBES" >"$work/lifeguard.log" 2>&1 & pids+=($!)

DIRECT=http://127.0.0.1:$APP/healthz/ready
VIA=http://127.0.0.1:$AGENT/app-health/app/readyz
for url in $DIRECT $VIA; do
  for _ in $(seq 1 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url" || true)" = 200 ] && break
    sleep 0.1
  done
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$url" || true)" = 200 ] || { echo "$url never answered 200" >&2; cat "$work"/*.log >&2; exit 1; }
done

to_us() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n }'; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
run_wrk() { # url connections -> "rps p50_us p99_us"
  local out
  out=$(taskset -c 1 wrk -t1 -c"$2" -d"${D}s" --latency -H "Connection: close" "$1")
  local errs
  errs=$(awk '/Non-2xx|Socket errors/ {print}' <<<"$out" | tr '\n' ' ')
  [ -n "$errs" ] && echo "  $1: $errs" >&2
  echo "$(awk '/^Requests\/sec/ {print $2}' <<<"$out") $(to_us "$(awk '$1 == "50%" {print $2}' <<<"$out")") $(to_us "$(awk '$1 == "99%" {print $2}' <<<"$out")")"
}

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) CPUs; wrk -t1 -d${D}s, new connection per probe, $R rounds"
for c in 1 8; do
  printf '\n## %s prober(s) at once\n%-6s %-10s %10s %10s %10s\n' "$c" round path probes/s p50_us p99_us
  declare -A P50=() RPS=()
  for r in $(seq 1 "$R"); do
    for s in direct lifeguard; do
      url=$DIRECT; [ $s = lifeguard ] && url=$VIA
      read -r rps p50 p99 < <(run_wrk "$url" "$c")
      P50[$s]+="$p50 "; RPS[$s]+="$rps "
      printf '%-6s %-10s %10.0f %10.0f %10.0f\n' "$r" $s "$rps" "$p50" "$p99"
    done
  done
  dp=$(tr ' ' '\n' <<<"${P50[direct]}" | grep . | median); lp=$(tr ' ' '\n' <<<"${P50[lifeguard]}" | grep . | median)
  dr=$(tr ' ' '\n' <<<"${RPS[direct]}" | grep . | median); lr=$(tr ' ' '\n' <<<"${RPS[lifeguard]}" | grep . | median)
  awk -v dp="$dp" -v lp="$lp" -v dr="$dr" -v lr="$lr" 'BEGIN {
    printf "median p50: direct %.0f us, through lifeguard %.0f us: %.2fx (%.0f us more per probe)\n", dp, lp, lp / dp, lp - dp
    printf "median probes/s: direct %.0f, through lifeguard %.0f: %.2fx\n", dr, lr, lr / dr }'
done
