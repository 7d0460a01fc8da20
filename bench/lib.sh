# Shared by the bench scripts (sourced).

# remap_bootstrap OUT ADMIN STATUS AGENT INBOUND APP PROM: writes
# config/envoy-bootstrap.yaml to OUT with its ports remapped and its
# listeners on 127.0.0.1 instead of 0.0.0.0.
remap_bootstrap() {
  sed -e 's/0\.0\.0\.0/127.0.0.1/g' \
      -e "s/port_value: 15000 /port_value: $2 /" -e "s/port_value: 15021 /port_value: $3 /" \
      -e "s/port_value: 15020 /port_value: $4 /" -e "s/port_value: 15006 /port_value: $5 /" \
      -e "s/port_value: 8080 /port_value: $6 /" -e "s/port_value: 15090 /port_value: $7 /" \
      config/envoy-bootstrap.yaml > "$1"
}

# bench_start PORT...: refuses to run when one of the loopback ports is
# taken; makes the scratch directory $work and the list $pids of the
# processes started, both cleaned up when the script exits.
bench_start() {
  local p
  for p in "$@"; do
    if (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null; then echo "port $p is in use" >&2; exit 1; fi
  done
  work=$(mktemp -d)
  pids=()
  trap bench_cleanup EXIT
}
bench_cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
