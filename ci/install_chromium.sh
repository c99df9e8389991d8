#!/usr/bin/env bash
# Install Debian's chromium if no Chromium-based browser is on PATH (idempotent): the test of the
# HTML report (tests/test_report_html.py) renders the page headless. On a machine without apt this
# prints why and exits 1; under CI=true that test then fails, saying no browser was found.
set -euo pipefail
for browser in chromium chromium-browser google-chrome google-chrome-stable; do
    if command -v "$browser" >/dev/null 2>&1; then
        exit 0
    fi
done
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ci/install_chromium.sh: no apt-get here: install chromium yourself for tests/test_report_html.py" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
chromium --version
