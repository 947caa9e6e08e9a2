#!/usr/bin/env bash
# Install the headless browser the `browser` tests drive (tests/test_browser.py).
#
# Playwright's own browser downloads are impossible in CI (no network beyond the package
# mirrors), so the tests use Debian's chromium through `executable_path=/usr/bin/chromium`.
# Run as root; idempotent.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
    /usr/bin/chromium --version
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "install_browser.sh: run as root (apt-get install -y chromium)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y chromium
/usr/bin/chromium --version
