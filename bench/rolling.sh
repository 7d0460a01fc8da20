#!/usr/bin/env bash
# A rolling restart of 3 pods behind a real HAProxy at 200 requests a
# second, the app's preStop hook side by side: none, sleep 1, 3 and 10 s,
# and lifeguard's drain wait; two load balancer settings (see
# bench/rolling.rs). Needs root; installs HAProxy from Debian when missing.
# Usage: bench/rolling.sh [ROUNDS=1]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v haproxy >/dev/null 2>&1 || apt-get install -y -qq --no-install-recommends haproxy >/dev/null
ENVOY_BIN=$(scripts/envoy-bin)
export ENVOY_BIN
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) CPUs, $(haproxy -v | head -n 1)"
cargo bench --locked --bench rolling -- "${1:-1}"
