#!/usr/bin/env bash
# Debian's Chromium and ChromeDriver (/usr/bin/chromium, /usr/bin/chromedriver) for the
# browser tests; no browser is downloaded (none can be). As root, Chromium needs
# --no-sandbox; on this closed network also keep it from calling home
# (--disable-background-networking etc.). Proved here: headless --dump-dom of a page.
set -euo pipefail
. "$(dirname "$0")/common.sh"

apt_install chromium chromium-driver

tmp=$(mktemp -d /tmp/runnerctl-chromecheck.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
printf '<!doctype html><title>t</title><p id="x">runnerctl-ok</p>\n' > "$tmp/page.html"
flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run
       --disable-background-networking --disable-component-update --disable-sync
       --disable-quic --user-data-dir="$tmp/profile")
timeout 60 chromium "${flags[@]}" --dump-dom about:blank >"$tmp/blank.html" 2>"$tmp/err.log" \
    || { tail -20 "$tmp/err.log" >&2; die "chromium --dump-dom about:blank"; }
grep -q '<body></body>' "$tmp/blank.html" || die "about:blank dumped: $(head -c 200 "$tmp/blank.html")"
timeout 60 chromium "${flags[@]}" --dump-dom "file://$tmp/page.html" 2>>"$tmp/err.log" | grep -q 'runnerctl-ok' \
    || { tail -20 "$tmp/err.log" >&2; die "chromium --dump-dom of a file"; }
chromedriver --version >/dev/null || die "chromedriver --version"

echo "setup chromium: ok ($(chromium --version 2>/dev/null | awk '{print $1, $2}'), $(chromedriver --version | awk '{print $1, $2}'), /usr/bin/chromium, /usr/bin/chromedriver; $(elapsed))"
