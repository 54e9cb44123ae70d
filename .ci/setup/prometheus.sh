#!/usr/bin/env bash
# Prometheus and promtool (Debian's package) for the monitoring tests, which run their own
# prometheus on loopback with a temporary config. Nothing is started here, and the
# package's own service is kept off port 9090: apt_install forbids maintainer scripts to
# start services, and an instance the package's init script did start is stopped.
# Proved here: promtool checks a config, and prometheus serves /-/ready on a loopback port.
set -euo pipefail
. "$(dirname "$0")/common.sh"

apt_install prometheus

if [ -x /etc/init.d/prometheus ] && /etc/init.d/prometheus status >/dev/null 2>&1; then
    /etc/init.d/prometheus stop >/dev/null 2>&1 || true
fi
update-rc.d prometheus disable >/dev/null 2>&1 || true
command -v prometheus >/dev/null && command -v promtool >/dev/null || die "prometheus/promtool not on PATH"

# Smoke test: our own instance on a free loopback port, stopped again.
tmp=$(mktemp -d /tmp/runnerctl-promcheck.XXXXXX)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo 19090)
cat > "$tmp/prometheus.yml" <<EOF
global:
  scrape_interval: 5s
scrape_configs:
  - job_name: self
    static_configs:
      - targets: ["127.0.0.1:$port"]
EOF
promtool check config "$tmp/prometheus.yml" >/dev/null || die "promtool check config"
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
    --web.listen-address="127.0.0.1:$port" </dev/null >"$tmp/prometheus.log" 2>&1 &
pid=$!
ready() { ( exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'GET /-/ready HTTP/1.0\r\n\r\n' >&3 && grep -q '200 OK' <&3 ) 2>/dev/null; }
wait_for 30 "prometheus on 127.0.0.1:$port" ready || { tail -20 "$tmp/prometheus.log" >&2; die "prometheus did not become ready"; }
kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""

busy=""
if (exec 3<>/dev/tcp/127.0.0.1/9090) 2>/dev/null; then busy=", NOTE: something else listens on 9090"; fi
version=$(prometheus --version 2>&1 | awk 'NR == 1 {print $3}')
echo "setup prometheus: ok (prometheus $version, $(command -v prometheus), $(command -v promtool), not started$busy; $(elapsed))"
