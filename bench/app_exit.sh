#!/usr/bin/env bash
# The app's exit -> Envoy stopped (p50/p99) with the app-exit drain policy,
# and every policy side by side, in a pod of namespaces and cgroups around
# the real Envoy 1.40 (see bench/app_exit.rs). Needs root.
# Usage: bench/app_exit.sh [RUNS=20] [RUNS_PER_OTHER_POLICY=3]
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY_BIN=$(scripts/envoy-bin)
export ENVOY_BIN
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) CPUs"
cargo bench --locked --bench app_exit -- "${1:-20}" "${2:-3}"
