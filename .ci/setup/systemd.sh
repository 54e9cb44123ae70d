#!/usr/bin/env bash
# systemd's tools (not systemd as PID 1: CI machines have none) for `runnerctl install`'s
# tests: `systemd-analyze verify` parses the units exactly as systemd would load them.
set -euo pipefail
. "$(dirname "$0")/common.sh"

apt_install systemd
systemd-analyze --version >/dev/null || die "systemd-analyze --version"
echo "setup systemd: ok ($(systemd-analyze --version | head -1); $(elapsed))"
