#!/bin/sh
# What lifeguard costs a production-scale Envoy: bench/scale.py for each
# cluster count. Usage: bench/scale.sh [SIZES=100,1000,5000,20000]
# (STEADY=10 SCRAPE=20 SCRAPE_TIMEOUT=10 seconds by default). Loopback ports 31100-31199.
set -eu
cd "$(dirname "$0")/.."
cargo build --profile dist --locked --bin lifeguard
if [ -z "${ENVOY_BIN:-}" ]; then
    ENVOY_BIN=$(scripts/envoy-bin)
    export ENVOY_BIN
fi
exec timeout 1800 python3 bench/scale.py "${1:-100,1000,5000,20000}"
