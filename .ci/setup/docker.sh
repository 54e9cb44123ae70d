#!/usr/bin/env bash
# A real Docker engine for the docker driver's tests, and a small local image (no registry
# is reachable): runnerctl-test/busybox:latest = FROM scratch + Debian's busybox-static
# with a symlink per applet in /bin (sh, env, cat, sleep, ...), /usr/bin/env, /etc/passwd.
# dockerd registers its NVIDIA device driver (for --gpus / DeviceRequest) only when an
# executable named nvidia-container-runtime-hook is on its PATH at start-up; a stand-in
# that reads stdin and exits 0 is enough here: containers then start with
# NVIDIA_VISIBLE_DEVICES set to the requested ids. A dockerd already answering is reused.
# dockerd runs on the default socket /var/run/docker.sock (log: /tmp/runnerctl-dockerd.log);
# if it cannot run with default flags, vfs storage and then no iptables/bridge are tried,
# and the flags that worked are kept in /opt/runnerctl-ci/dockerd.flags for the next start.
set -euo pipefail
. "$(dirname "$0")/common.sh"

IMAGE=runnerctl-test/busybox:latest
LOG=/tmp/runnerctl-dockerd.log
FLAGS_FILE=$RUNNERCTL_CI_DIR/dockerd.flags
export DOCKER_BUILDKIT=0          # legacy builder: the engine is 20.10, no buildx plugin

apt_install docker.io busybox-static

hookdir=$RUNNERCTL_CI_DIR/bin
mkdir -p "$hookdir"
printf '#!/bin/sh\n# stand-in for NVIDIA'"'"'s OCI hook (runnerctl CI): no GPUs here\ncat >/dev/null\nexit 0\n' \
    > "$hookdir/nvidia-container-runtime-hook"
chmod 755 "$hookdir/nvidia-container-runtime-hook"

docker_ok() { timeout 10 docker info >/dev/null 2>&1; }

# The image: a rootfs folder copied in (no RUN step, so building needs no container).
build_image() {
    local recipe ctx applet
    recipe=$( { sha256sum /bin/busybox; echo "recipe 3"; } | sha256sum | cut -c1-16)
    if [ "$(docker image inspect -f '{{index .Config.Labels "runnerctl.recipe"}}' "$IMAGE" 2>/dev/null)" = "$recipe" ]; then
        return 0
    fi
    ctx=$(mktemp -d /tmp/runnerctl-busybox.XXXXXX)
    mkdir -p "$ctx/rootfs/bin" "$ctx/rootfs/usr/bin" "$ctx/rootfs/etc" "$ctx/rootfs/tmp" "$ctx/rootfs/root"
    cp /bin/busybox "$ctx/rootfs/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [ "$applet" = busybox ] || ln -s busybox "$ctx/rootfs/bin/$applet"
    done
    ln -s ../../bin/busybox "$ctx/rootfs/usr/bin/env"
    chmod 1777 "$ctx/rootfs/tmp"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$ctx/rootfs/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' > "$ctx/rootfs/etc/group"
    cat > "$ctx/Dockerfile" <<EOF
FROM scratch
COPY rootfs/ /
ENV PATH=/bin:/usr/bin
LABEL runnerctl.recipe=$recipe
CMD ["sh"]
EOF
    docker build -q -t "$IMAGE" "$ctx" >"$ctx/build.log" 2>&1 || { cat "$ctx/build.log" >&2; rm -rf "$ctx"; return 1; }
    rm -rf "$ctx"
}

smoke() { build_image && timeout 60 docker run --rm "$IMAGE" true; }

started=reused
if ! docker_ok; then
    if pgrep -x dockerd >/dev/null; then
        wait_for 60 "the running dockerd to answer" docker_ok || die "a dockerd runs but does not answer (not ours: not restarted)"
    else
        rm -f /var/run/docker.pid            # stale: no dockerd runs
        candidates=()
        [ -s "$FLAGS_FILE" ] && candidates+=("$(cat "$FLAGS_FILE")")
        candidates+=("" "--storage-driver=vfs" "--storage-driver=vfs --iptables=false --bridge=none")
        started=""
        for flags in "${candidates[@]}"; do
            # shellcheck disable=SC2086
            pid=$(start_daemon "$LOG" env PATH="$hookdir:$PATH" dockerd $flags)
            up=0
            for _ in $(seq 1 60); do
                docker_ok && { up=1; break; }
                kill -0 "$pid" 2>/dev/null || break
                sleep 1
            done
            if [ $up -eq 1 ] && smoke >/dev/null 2>&1; then
                started="started${flags:+ with $flags}"
                mkdir -p "$RUNNERCTL_CI_DIR" && printf '%s' "$flags" > "$FLAGS_FILE"
                break
            fi
            log "dockerd ${flags:-(default flags)} did not work; see $LOG"
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
            kill -9 "$pid" 2>/dev/null || true
            rm -f /var/run/docker.pid
        done
        [ -n "$started" ] || { tail -30 "$LOG" >&2; die "dockerd would not run with any flags"; }
    fi
fi
build_image || die "docker build of $IMAGE"

# Checks: --gpus sets NVIDIA_VISIBLE_DEVICES; a bind mount reads and writes; the Python SDK
# creates a container with a DeviceRequest.
got=$(timeout 60 docker run --rm --gpus '"device=GPU-a,GPU-b"' "$IMAGE" env | grep '^NVIDIA_VISIBLE_DEVICES=' || true)
[ "$got" = "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b" ] \
    || die "docker run --gpus gave '$got' (is nvidia-container-runtime-hook on the running dockerd's PATH?)"

tmp=$(mktemp -d /tmp/runnerctl-dockercheck.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo in > "$tmp/in"
timeout 60 docker run --rm -v "$tmp:/data" "$IMAGE" sh -c 'cat /data/in > /data/out; echo out >> /data/out'
[ "$(cat "$tmp/out" 2>/dev/null)" = "$(printf 'in\nout')" ] || die "bind mount check"

venv=$RUNNERCTL_CI_DIR/venv-docker-sdk
if ! "$venv/bin/python" -c 'import docker' 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv" || die "python3 -m venv (install python3-venv)"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check docker </dev/null >"$tmp/pip.log" 2>&1 \
        || { tail -20 "$tmp/pip.log" >&2; die "pip install docker"; }
fi
"$venv/bin/python" - "$IMAGE" <<'PY' || die "docker SDK DeviceRequest check"
import sys
import docker
from docker.types import DeviceRequest

client = docker.from_env()
container = client.containers.create(
    sys.argv[1], ["env"], labels={"runnerctl-ci": "setup-check"},
    device_requests=[DeviceRequest(device_ids=["GPU-a", "GPU-b"], capabilities=[["gpu"]])])
try:
    container.start()
    assert container.wait(timeout=60)["StatusCode"] == 0
    out = container.logs().decode()
    assert "NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b" in out.splitlines(), out
    req = container.attrs["HostConfig"]["DeviceRequests"][0]
    assert req["DeviceIDs"] == ["GPU-a", "GPU-b"], req
finally:
    container.remove(force=True)
PY

server=$(docker version --format '{{.Server.Version}}')
driver=$(docker info --format '{{.Driver}}')
echo "setup docker: ok (engine $server, $driver, dockerd $started, image $IMAGE, --gpus + bind mount + SDK DeviceRequest checked; $(elapsed))"
