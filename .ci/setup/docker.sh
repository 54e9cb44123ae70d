#!/usr/bin/env bash
# A real Docker engine for the docker driver's tests, and a small local image (no
# registry is reachable): FROM scratch + Debian's busybox-static. dockerd registers its
# NVIDIA device driver (for --gpus / DeviceRequest) only when an executable named
# nvidia-container-runtime-hook is on its PATH at start-up; a stand-in that reads stdin
# and exits 0 is enough here: containers then start with NVIDIA_VISIBLE_DEVICES set.
set -euo pipefail
. "$(dirname "$0")/common.sh"
apt_install docker.io busybox-static
hookdir=/opt/runnerctl-ci/bin
mkdir -p "$hookdir"
printf '#!/bin/sh\ncat >/dev/null\nexit 0\n' > "$hookdir/nvidia-container-runtime-hook"
chmod +x "$hookdir/nvidia-container-runtime-hook"
if ! docker info >/dev/null 2>&1; then
    PATH="$hookdir:$PATH" nohup dockerd >/tmp/runnerctl-dockerd.log 2>&1 &
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
fi
docker info >/dev/null 2>&1 || { tail -20 /tmp/runnerctl-dockerd.log; exit 1; }
if ! docker image inspect runnerctl-test/busybox:latest >/dev/null 2>&1; then
    ctx=$(mktemp -d)
    cp /bin/busybox "$ctx/busybox"
    printf 'FROM scratch\nCOPY busybox /bin/busybox\nRUN ["/bin/busybox", "--install", "-s", "/bin"]\nENV PATH=/bin\nCMD ["sh"]\n' > "$ctx/Dockerfile"
    docker build -q -t runnerctl-test/busybox:latest "$ctx" >/dev/null 2>&1
    rm -rf "$ctx"
fi
got=$(docker run --rm --gpus '"device=GPU-a,GPU-b"' runnerctl-test/busybox:latest env | grep '^NVIDIA_VISIBLE_DEVICES=')
[ "$got" = "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b" ] || { echo "docker --gpus check failed: $got"; exit 1; }
echo "setup docker: ok ($(docker version --format '{{.Server.Version}}'), image runnerctl-test/busybox:latest)"
