#!/usr/bin/env bash
# What an ingress gateway's drain does to its kept-alive clients (see
# bench/keepalive.rs): one gateway deleted behind a load balancer that
# checks its node (L4, kept-alive clients), one that checks the pod over
# L4 (kept-alive clients) and one that checks the pod over L7 and pools
# its connections, the gateway's traffic listener as shipped
# (drain_type MODIFY_ONLY), with the default drain type, and without the
# health_check filter: the connections opened during the drain, requests
# lost, and how the drain ended. Needs root; installs HAProxy from Debian
# when missing.
# Usage: bench/keepalive.sh [ROUNDS=1]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v haproxy >/dev/null 2>&1 || apt-get install -y -qq --no-install-recommends haproxy >/dev/null
ENVOY_BIN=$(scripts/envoy-bin)
export ENVOY_BIN
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) CPUs, $(haproxy -v | head -n 1), Envoy $("$ENVOY_BIN" --version | grep -o '/[0-9]*\.[0-9]*\.[0-9]*/' | tail -n 1 | tr -d /)"
cargo bench --locked --bench keepalive -- "${1:-1}"
