#!/usr/bin/env bash
# Rolling restarts of 3 pods behind real load balancers, the app's preStop
# hook side by side (see bench/rolling.rs): `balancers` (the default): every
# kind of load balancer (HAProxy checking 15021 or the traffic port, HAProxy
# without checks and the pod dropped from its endpoints 0.5-3 s after
# deletion, Envoy as the front proxy) at issue #34's rates and at 200/s,
# without a hook and with the drain wait; `hooks`: HAProxy at 200/s, no
# hook, sleep 1, 3 and 10 s, and the drain wait; `gateways`: ingress
# gateways behind each kind of load balancer at 200/s and 2/s, their drain
# out of rotation, a fixed 10 s, or zero requests after 5 s; `nodes`: a
# gateway and a sidecar's pod behind a load balancer that checks the node
# (kube-proxy's rules modelled), the kubelet answered as Envoy is or 503
# from SIGTERM. Needs root; installs HAProxy from Debian when missing.
# Usage: bench/rolling.sh [ROUNDS=1] [balancers|hooks|gateways|nodes]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v haproxy >/dev/null 2>&1 || apt-get install -y -qq --no-install-recommends haproxy >/dev/null
ENVOY_BIN=$(scripts/envoy-bin)
export ENVOY_BIN
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) CPUs, $(haproxy -v | head -n 1)"
cargo bench --locked --bench rolling -- "${1:-1}" "${2:-balancers}"
