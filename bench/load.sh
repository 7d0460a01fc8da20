#!/usr/bin/env bash
# Load benchmark on loopback, in one run, alternating (a b c a b c ...):
#   a. lifeguard GET /healthz/ready (ready; Envoy's admin answered by a real
#      Envoy 1.40 started from config/envoy-bootstrap.yaml)
#   b. bare-hyper: a bare hyper 1.x server answering a static 200, built in
#      the same (release) profile: the ceiling for this stack
#   c. nginx `return 200;` (one worker)
#   d. with BASELINE=PATH: another lifeguard binary (say, built from an
#      earlier commit), probed the same way, for a before/after ratio
#      measured side by side
#   e. when Go is installed: Go net/http answering a static 200
#      (bench/go_http/main.go), the stack of pilot-agent's status server;
#      skipped otherwise
# Each server is pinned to CPU 0, wrk (one thread) to CPU 1. Same threads,
# connections and duration for all three. Then: admin requests Envoy saw
# while lifeguard was probed at full rate, and p50/p99/p99.9 at half of
# lifeguard's peak rate from bench/loadgen.rs (open-loop, corrected for
# coordinated omission).
#
# Usage: [LIFEGUARD=path/to/lifeguard] [BASELINE=path/to/lifeguard] bench/load.sh [SECONDS_PER_RUN=10] [ROUNDS=3] [CONNECTIONS=32]
#   LIFEGUARD: the binary under test (default target/dist/lifeguard,
#   built here); give dist/lifeguard (scripts/release) to compare it with a
#   baseline built the same way
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-10}
R=${2:-3}
C=${3:-32}

sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
need() {
  command -v "$1" >/dev/null 2>&1 && return
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "$2" >/dev/null
}
need wrk wrk
need nginx nginx-light
need taskset util-linux
ENVOY=$(scripts/envoy-bin)
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

if [ -n "${LIFEGUARD:-}" ]; then
  cargo build --profile dist --quiet --example bare-hyper --example loadgen
else
  cargo build --profile dist --quiet --bin lifeguard --example bare-hyper --example loadgen
  LIFEGUARD=target/dist/lifeguard
fi

# Ports 31000-31099, below the ephemeral range; refuse to run if taken.
ADMIN=31000; STATUS=31021; AGENT=31020; INBOUND=31006; APP=31080; PROM=31090; BARE=31081; NGX=31082; BASE=31022; GO=31083
SERVERS="lifeguard bare-hyper nginx"
[ -n "${BASELINE:-}" ] && SERVERS="$SERVERS baseline"
if command -v go >/dev/null 2>&1; then SERVERS="$SERVERS go"; else echo "bench/load.sh: no Go: the Go net/http stand-in is skipped" >&2; fi
. bench/lib.sh
bench_start $ADMIN $STATUS $AGENT $INBOUND $PROM $BARE $NGX $BASE $GO
if [[ " $SERVERS " == *" go "* ]]; then
  (cd bench/go_http && GO111MODULE=off go build -o "$work/go-http" main.go)
fi
remap_bootstrap "$work/envoy.yaml" $ADMIN $STATUS $AGENT $INBOUND $APP $PROM
sed -e "s#PREFIX#$work#g" -e "s/PORT/$NGX/" bench/nginx.conf > "$work/nginx.conf"

taskset -c 1 "$ENVOY" -c "$work/envoy.yaml" --disable-hot-restart -l error --concurrency 1 >"$work/envoy.log" 2>&1 & pids+=($!)
LIFEGUARD_LOG=warn taskset -c 0 "$LIFEGUARD" run --status-addr 127.0.0.1:$AGENT --admin-url http://127.0.0.1:$ADMIN >"$work/lifeguard.log" 2>&1 & pids+=($!)
taskset -c 0 target/dist/examples/bare-hyper 127.0.0.1:$BARE >"$work/bare.log" 2>&1 & pids+=($!)
if [ -n "${BASELINE:-}" ]; then
  LIFEGUARD_LOG=warn taskset -c 0 "$BASELINE" run --status-addr 127.0.0.1:$BASE --admin-url http://127.0.0.1:$ADMIN >"$work/baseline.log" 2>&1 & pids+=($!)
fi
taskset -c 0 "$NGINX" -c "$work/nginx.conf" -p "$work" >"$work/nginx.out" 2>&1 & pids+=($!)
if [[ " $SERVERS " == *" go "* ]]; then
  GOMAXPROCS=1 taskset -c 0 "$work/go-http" 127.0.0.1:$GO >"$work/go.log" 2>&1 & pids+=($!)
fi

wait_200() {
  for _ in $(seq 1 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$1" || true)" = 200 ] && return 0
    sleep 0.1
  done
  echo "$1 never answered 200" >&2; cat "$work"/*.log >&2; exit 1
}
A=http://127.0.0.1:$AGENT/healthz/ready
B=http://127.0.0.1:$BARE/healthz/ready
N=http://127.0.0.1:$NGX/healthz/ready
D_URL=http://127.0.0.1:$BASE/healthz/ready
wait_200 $A; wait_200 $B; wait_200 $N
[ -n "${BASELINE:-}" ] && wait_200 $D_URL
G_URL=http://127.0.0.1:$GO/healthz/ready
[[ " $SERVERS " == *" go "* ]] && wait_200 $G_URL

to_us() { # wrk latency like 85.00us, 1.20ms, 1.01s -> microseconds
  awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n }'
}
run_wrk() { # name url mode -> "rps p50_us p99_us"
  local extra=()
  [ "$3" = close ] && extra=(-H "Connection: close")
  local out
  out=$(taskset -c 1 wrk -t1 -c"$C" -d"${D}s" --latency "${extra[@]}" "$2")
  local rps p50 p99 errs
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  p50=$(to_us "$(awk '$1 == "50%" {print $2}' <<<"$out")")
  p99=$(to_us "$(awk '$1 == "99%" {print $2}' <<<"$out")")
  errs=$(awk '/Non-2xx|Socket errors/ {print}' <<<"$out" | tr '\n' ' ')
  [ -n "$errs" ] && echo "  $1 $3: $errs" >&2
  echo "$rps $p50 $p99"
}
admin_rq() {
  curl -s "http://127.0.0.1:$ADMIN/stats?filter=%5Ehttp.admin.downstream_rq_total%24" | awk -F': ' '{print $2}'
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) CPUs; wrk -t1 -c$C -d${D}s, $R rounds, servers on CPU 0, wrk on CPU 1"
declare -A RPS P99
for mode in keepalive close; do
  printf '\n## %s\n%-6s %-10s %12s %10s %10s\n' "$mode" round server req/s p50_us p99_us
  for r in $(seq 1 "$R"); do
    for s in $SERVERS; do
      case $s in lifeguard) url=$A ;; bare-hyper) url=$B ;; nginx) url=$N ;; baseline) url=$D_URL ;; go) url=$G_URL ;; esac
      before=0; [ $s = lifeguard ] && before=$(admin_rq)
      read -r rps p50 p99 < <(run_wrk $s "$url" $mode)
      if [ $s = lifeguard ]; then
        after=$(admin_rq)
        ADMIN_LINE="admin requests Envoy received during $D s of probes at $rps req/s ($mode): $((after - before)) ($(awk -v a=$((after - before)) -v d="$D" 'BEGIN {printf "%.1f", a / d}')/s; lifeguard polls once per second)"
        echo "  $ADMIN_LINE" >&2
      fi
      RPS[$mode,$s]+="$rps "
      P99[$mode,$s]+="$p99 "
      printf '%-6s %-10s %12.0f %10.0f %10.0f\n' "$r" $s "$rps" "$p50" "$p99"
    done
  done
  a=$(tr ' ' '\n' <<<"${RPS[$mode,lifeguard]}" | grep . | median)
  b=$(tr ' ' '\n' <<<"${RPS[$mode,bare-hyper]}" | grep . | median)
  c=$(tr ' ' '\n' <<<"${RPS[$mode,nginx]}" | grep . | median)
  for s in $SERVERS; do
    vals=$(tr ' ' '\n' <<<"${RPS[$mode,$s]}" | grep . | sort -n | tr '\n' ' ')
    printf 'median %-10s %10.0f req/s  (min-max: %s)\n' $s "$(tr ' ' '\n' <<<"$vals" | grep . | median)" "$(awk '{print $1 "-" $NF}' <<<"$vals")"
  done
  awk -v a="$a" -v b="$b" -v c="$c" 'BEGIN {printf "ratio a/b (lifeguard / bare hyper) = %.3f\nratio a/c (lifeguard / nginx)      = %.3f\n", a / b, a / c}'
  if [ -n "${BASELINE:-}" ]; then
    d=$(tr ' ' '\n' <<<"${RPS[$mode,baseline]}" | grep . | median)
    awk -v a="$a" -v d="$d" 'BEGIN {printf "ratio a/d (lifeguard / baseline)   = %.3f\n", a / d}'
  fi
  if [[ " $SERVERS " == *" go "* ]]; then
    e=$(tr ' ' '\n' <<<"${RPS[$mode,go]}" | grep . | median)
    awk -v a="$a" -v e="$e" 'BEGIN {printf "ratio a/e (lifeguard / Go net/http) = %.3f\n", a / e}'
  fi
  [ $mode = keepalive ] && PEAK=$a
done

HALF=$(awk -v p="$PEAK" 'BEGIN {printf "%d", p / 2}')
printf '\n## open loop at half of lifeguard keep-alive peak (%s req/s), 16 connections, %s s\n' "$HALF" "$D"
for s in lifeguard bare-hyper nginx; do
  case $s in lifeguard) url=$A ;; bare-hyper) url=$B ;; nginx) url=$N ;; esac
  printf '%-10s %s\n' $s "$(taskset -c 1 target/dist/examples/loadgen "$url" "$HALF" "$D" 16)"
done
