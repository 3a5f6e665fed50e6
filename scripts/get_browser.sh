#!/usr/bin/env bash
# A headless browser for the HTML report's test (zoo attend --html): Debian's chromium, installed
# like the data, where apt is there and we are root. Nothing else needs it.
set -u
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "Installing Debian's chromium (for the HTML report's browser test) ..."
  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; }) \
    && { echo "chromium installed"; exit 0; }
fi
echo "chromium is not installed and could not be installed here: the HTML report's browser test will fail" \
     "(install it with: sudo apt-get install chromium)"
exit 0
