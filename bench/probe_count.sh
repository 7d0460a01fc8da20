#!/usr/bin/env bash
# The probe counted in instructions (valgrind's callgrind), which a busy
# neighbour does not move as it moves time: each case of the criterion
# bench `bench/probe.rs`, run under callgrind with collection on only
# inside criterion's measured loop, and the instructions one probe takes:
#   probe_service_*: StatusService::call and the poll of its future
#     (`now`), inclusive, over the calls from criterion's loop;
#   probe_hyper_duplex_keepalive: everything in the loop (client, server,
#     runtime) over the round trips (the client's received responses,
#     less the 1,100 the bench makes before criterion starts).
# With BASELINE_BENCH=path (another commit's probe bench binary: `cargo
# bench --bench probe --no-run` there), its cases are counted beside, and
# the ratios printed. A case the baseline lacks is skipped; a baseline
# case named `<case>_as_served` is used for `<case>` when present.
#
# Usage: [BASELINE_BENCH=path] bench/probe_count.sh [CASE_REGEX=.]
#   Needs valgrind (Debian: valgrind) and python3. Takes about a minute a
#   case and binary (two run at once).
set -euo pipefail
cd "$(dirname "$0")/.."
FILTER=${1:-.}
command -v valgrind >/dev/null || { echo "bench/probe_count.sh: valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
BENCH=$(cargo bench --bench probe --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="probe" and m.get("executable"): print(m["executable"])' | tail -1)
[ -x "$BENCH" ] || { echo "bench/probe_count.sh: the probe bench did not build" >&2; exit 1; }
. bench/lib.sh
bench_start

cases=(probe_service_ready probe_service_not_ready probe_service_ready_lb_checker probe_hyper_duplex_keepalive)

# count BIN CASE OUT: prints the instructions of one probe.
count() {
  local bin=$1 case=$2 out=$3 toggle='criterion::bencher::Bencher<M>::iter_batched*'
  [[ $case == probe_hyper* ]] && toggle='criterion::bencher::Bencher<M>::iter_custom*'
  valgrind --tool=callgrind --toggle-collect="$toggle" --callgrind-out-file="$out" \
    "$bin" --bench "^$case\$" --profile-time 3 >"$out.log" 2>&1
  callgrind_annotate --inclusive=yes --tree=caller "$out" 2>/dev/null >"$out.tree"
  python3 - "$out.tree" "$case" <<'EOF'
import re, sys
lines = open(sys.argv[1]).read().split('\n')
case = sys.argv[2]
def callers(i, pred):
    # The caller lines above a function's line: (instructions, calls) from
    # the callers that match pred.
    total = calls = 0
    j = i - 1
    while j >= 0 and lines[j].strip() and '<' in lines[j]:
        m = re.match(r'^\s*([\d,]+) .*<.*\(([\d,]+)x\)', lines[j])
        if m and pred(lines[j]):
            total += int(m.group(1).replace(',', ''))
            calls += int(m.group(2).replace(',', ''))
        j -= 1
    return total, calls
if case.startswith('probe_hyper'):
    program = next(int(l.split()[0].replace(',', '')) for l in lines if 'PROGRAM TOTALS' in l)
    for i, l in enumerate(lines):
        if re.search(r'\*\s+\S+?:<hyper::proto::h1::dispatch::Client<B> as hyper::proto::h1::dispatch::Dispatch>::recv_msg( \[|$)', l):
            _, calls = callers(i, lambda c: True)
            if calls:
                break
    print(round(program / (calls - 1100)))
else:
    found = {}
    for i, l in enumerate(lines):
        # A function's own line (not a part inlined into it): the one
        # criterion's loop calls.
        m = re.match(r'^\s*[\d,]+ \(.*?\)\s+\*\s+\S+?\.rs:(.*?)( \[.*)?$', l)
        if not m:
            continue
        name = m.group(1)
        key = None
        if 'StatusService as tower_service::Service' in name and name.endswith('::call'):
            key = 'call'
        elif name == 'probe::now':
            key = 'now'
        if key:
            total, calls = callers(i, lambda c: 'iter_batched' in c)
            if calls:
                found[key] = (total, calls)
    (call, n), (now, _) = found['call'], found['now']
    print(round((call + now) / n))
EOF
}

printf '# %s; instructions a probe (callgrind)\n' "$(date -u +%Y-%m-%dT%H:%MZ)"
printf '%-32s %10s %10s %8s\n' case now baseline ratio
for c in "${cases[@]}"; do
  [[ $c =~ $FILTER ]] || continue
  base_case=""
  if [ -n "${BASELINE_BENCH:-}" ]; then
    for cand in "${c}_as_served" "$c"; do
      if grep -qx "$cand: benchmark" <<<"$("$BASELINE_BENCH" --list 2>/dev/null)"; then base_case=$cand; break; fi
    done
  fi
  count "$BENCH" "$c" "$work/now.$c" >"$work/now.$c.n" &
  [ -n "$base_case" ] && count "$BASELINE_BENCH" "$base_case" "$work/base.$c" >"$work/base.$c.n"
  wait
  now=$(cat "$work/now.$c.n")
  if [ -n "$base_case" ]; then
    base=$(cat "$work/base.$c.n")
    printf '%-32s %10s %10s %8s\n' "$c" "$now" "$base" "$(awk -v a="$now" -v b="$base" 'BEGIN{printf "%.3f", a/b}')"
  else
    printf '%-32s %10s %10s %8s\n' "$c" "$now" - -
  fi
done
