#!/usr/bin/env bash
# Install Debian's redis-server if it is not there (idempotent). The two-worker demonstration
# of `mla-fuse fuzz` (tests/test_fuzz_redis.py) starts its own server on a free loopback port;
# nothing here starts one.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends redis-server >/dev/null
# Debian's package may start a system service on port 6379; the tests do not use it.
redis-server --version
