# shellcheck shell=bash
# Helpers for .ci/setup/*.sh (sourced, not run). Every script here must be safe to run
# twice, need no stdin, and work on a fresh Debian 12 machine as root with no systemd.
export DEBIAN_FRONTEND=noninteractive
export NEEDRESTART_MODE=a
SETUP_STARTED=$(date +%s)
# shellcheck disable=SC2034  # used by the scripts that source this file
RUNNERCTL_CI_DIR=/opt/runnerctl-ci          # our own helper files (hook stand-in, venv)
RUNNERCTL_CI_STAMP=/var/tmp/runnerctl-ci-apt-updated

log() { echo "setup: $*" >&2; }
die() { echo "setup: FAILED: $*" >&2; exit 1; }
elapsed() { echo "$(( $(date +%s) - SETUP_STARTED )) s"; }

# wait_for SECONDS DESCRIPTION CMD...: run CMD (quietly) once a second until it succeeds.
wait_for() {
    local timeout=$1 what=$2; shift 2
    local deadline=$(( $(date +%s) + timeout ))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || { log "timed out after ${timeout}s waiting for $what"; return 1; }
        sleep 1
    done
}

# pkg_installed PKG: true when dpkg has PKG fully installed.
pkg_installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

_apt_update() {
    apt-get -o Acquire::Retries=3 -o DPkg::Lock::Timeout=300 update -qq >/dev/null \
        || apt-get -o Acquire::Retries=3 -o DPkg::Lock::Timeout=300 update -qq
    touch "$RUNNERCTL_CI_STAMP"
}

# apt_install PKG...: install what is missing, without recommends. `apt-get update` runs at
# most once per CI run (the stamp is younger than an hour), and again if an install fails
# on stale lists. Package maintainer scripts may not start services (policy-rc.d says 101
# while we install): our scripts start what they need themselves, with their own flags.
apt_install() {
    local missing=() pkg
    for pkg in "$@"; do pkg_installed "$pkg" || missing+=("$pkg"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    local policy=/usr/sbin/policy-rc.d ours=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && ours=1
    fi
    if [ -z "$(find "$RUNNERCTL_CI_STAMP" -mmin -60 2>/dev/null)" ]; then _apt_update; fi
    local opts=(-y -qq --no-install-recommends -o Acquire::Retries=3 -o DPkg::Lock::Timeout=300
                -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
    local out rc=0
    out=$(apt-get install "${opts[@]}" "${missing[@]}" </dev/null 2>&1) || rc=$?
    if [ $rc -ne 0 ]; then            # stale package lists (404) or a half-configured dpkg
        log "apt-get install ${missing[*]} failed (rc $rc); updating lists and retrying"
        dpkg --configure -a >/dev/null 2>&1 || true
        _apt_update
        rc=0
        out=$(apt-get install "${opts[@]}" "${missing[@]}" </dev/null 2>&1) || rc=$?
        [ $rc -eq 0 ] || { [ $ours -eq 1 ] && rm -f "$policy"; echo "$out" | tail -20 >&2; die "apt-get install ${missing[*]}"; }
    fi
    [ $ours -eq 1 ] && rm -f "$policy"
    return 0
}

# start_daemon LOGFILE CMD...: start CMD detached from this script (own session, no stdin),
# appending stdout/stderr to LOGFILE; prints its pid.
start_daemon() {
    local logfile=$1; shift
    mkdir -p "$(dirname "$logfile")"
    setsid "$@" </dev/null >>"$logfile" 2>&1 &
    echo $!
}
