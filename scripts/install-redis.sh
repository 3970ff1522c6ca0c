#!/usr/bin/env bash
# Installs the distribution's Redis server for `homa kv-bench` (issue #24),
# which compares the homa-kv store with Redis GET and SET+WAIT in the same
# run. Idempotent: does nothing when `redis-server` is already installed.
# Needs root (apt-get).
set -euo pipefail

if command -v redis-server >/dev/null 2>&1; then
    echo "install-redis: $(redis-server --version | head -1) already installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-redis: redis-server is missing and installing it needs root" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y redis-server
# The package may start a system-wide server on port 6379; kv-bench starts
# its own servers on free ports and does not use it.
echo "install-redis: $(redis-server --version | head -1)"
