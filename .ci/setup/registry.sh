#!/usr/bin/env bash
# A real Docker registry (Debian's docker-registry, the distribution registry v2) and
# htpasswd (apache2-utils) for the docker driver's registry-credential tests, which start
# their own registry with basic auth on a loopback port (the engine treats 127.0.0.0/8 as
# an insecure registry, so no TLS) and push the local test image to it. Nothing is left
# running here: the package's own service is stopped and disabled.
# Proved here: a registry with htpasswd auth answers /v2/ with 401 without credentials
# and 200 with them.
set -euo pipefail
. "$(dirname "$0")/common.sh"

apt_install docker-registry apache2-utils

if [ -x /etc/init.d/docker-registry ] && /etc/init.d/docker-registry status >/dev/null 2>&1; then
    /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
fi
update-rc.d docker-registry disable >/dev/null 2>&1 || true
command -v docker-registry >/dev/null && command -v htpasswd >/dev/null || die "docker-registry/htpasswd not on PATH"

tmp=$(mktemp -d /tmp/runnerctl-registrycheck.XXXXXX)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
htpasswd -Bbn ci check-pass > "$tmp/htpasswd"
cat > "$tmp/config.yml" <<YAML
version: 0.1
storage:
  filesystem:
    rootdirectory: $tmp/data
http:
  addr: 127.0.0.1:$port
auth:
  htpasswd:
    realm: runnerctl-ci
    path: $tmp/htpasswd
YAML
docker-registry serve "$tmp/config.yml" </dev/null >"$tmp/registry.log" 2>&1 &
pid=$!
status() { python3 -c 'import sys, urllib.request as u
req = u.Request(sys.argv[1])
if len(sys.argv) > 2:
    import base64; req.add_header("Authorization", "Basic " + base64.b64encode(sys.argv[2].encode()).decode())
try:
    print(u.urlopen(req, timeout=5).status)
except u.HTTPError as e:
    print(e.code)' "http://127.0.0.1:$port/v2/" "$@"; }
answers() { [ "$(status 2>/dev/null)" = 401 ]; }
wait_for 30 "docker-registry on 127.0.0.1:$port" answers || { tail -20 "$tmp/registry.log" >&2; die "docker-registry did not answer 401"; }
[ "$(status ci:check-pass)" = 200 ] || die "docker-registry refused its own htpasswd user"
kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
echo "setup registry: ok (docker-registry $(dpkg-query -W -f='${Version}' docker-registry), basic auth checked; $(elapsed))"
