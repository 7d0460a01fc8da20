#!/usr/bin/env bash
# What a quiet pod's drain costs: the drain's time against the pod's
# traffic rate, lifeguard's defaults and --drain-wait-max-quiet-period 5s
# side by side (see bench/quiet_drain.rs). About 3 minutes.
# Usage: bench/quiet_drain.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY_BIN=$(scripts/envoy-bin)
export ENVOY_BIN
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) CPUs"
cargo bench --locked --bench quiet_drain
