#!/usr/bin/env bash
# Drain reaction times and idle footprint against the real Envoy 1.40.
# Usage: bench/reaction.sh [RUNS=20] [IDLE_SECONDS=30]
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY_BIN=$(scripts/envoy-bin)
export ENVOY_BIN
cargo build --profile dist --quiet --bin lifeguard --example reaction
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) CPUs"
target/dist/examples/reaction "${1:-20}" "${2:-30}"
