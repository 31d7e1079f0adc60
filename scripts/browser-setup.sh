#!/usr/bin/env bash
# What the browser test (tests/console_browser.rs) needs: Debian's Chromium
# and playwright-core (tests/browser, from its lockfile). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x /usr/bin/chromium ]; then
    echo "browser-setup: installing chromium (Debian package)" >&2
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >&2
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "browser-setup: installing nodejs and npm (Debian packages)" >&2
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm >&2
fi
if [ ! -d tests/browser/node_modules/playwright-core ]; then
    echo "browser-setup: installing playwright-core (npm)" >&2
    (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
