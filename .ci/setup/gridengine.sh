#!/usr/bin/env bash
# A real single-node Grid Engine (Debian's gridengine 8.1.9) for the sge driver's tests.
# The packages' postinst builds the cell from debconf answers (shared/gridengineconfig,
# shared/gridenginecell, shared/gridenginemaster: gridengine-common's templates), so they
# are preseeded. Then, as qconf edits (each applied only when not yet there):
#  - host_aliases: this host's name resolves to 127.0.0.1 here, which Grid Engine calls
#    `localhost`; the alias file makes both names one host;
#  - min_uid/min_gid 0 in the global config, so root (gitlab-runner's user in CI) may run jobs;
#  - load_thresholds NONE on all.q, so a busy 2-core box never puts the queue in alarm;
#  - a `gpu` INT consumable per job (requestable, consumable JOB, default 0) with gpu=8 on
#    this host: `qsub -l gpu=N` is counted once per job (a per-slot YES would count it once
#    per slot of `-pe smp K`) and refused when no host has N; Grid Engine hands out no
#    device ids (the sge driver picks them);
#  - the scheduler runs every second (default 15 s), all.q has 16 slots on this host; `qsub -w e` refuses impossible requests at once.
# Daemons run as sgeadmin (started as root: /usr/sbin/sge_qmaster, /usr/sbin/sge_execd),
# logs in /var/spool/gridengine/{qmaster,execd/HOST}/messages. Safe to run twice.
set -euo pipefail
. "$(dirname "$0")/common.sh"

node=$(hostname)
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
if ! pkg_installed gridengine-master || ! pkg_installed gridengine-exec; then
    printf '%s\n' "gridengine-common shared/gridengineconfig boolean true" \
        "gridengine-common shared/gridenginecell string default" \
        "gridengine-common shared/gridenginemaster string $node" | debconf-set-selections
fi
apt_install gridengine-common gridengine-client gridengine-master gridengine-exec

common=$SGE_ROOT/$SGE_CELL/common
[ -f "$common/act_qmaster" ] || die "gridengine-master did not create a cell in $SGE_ROOT/$SGE_CELL"
alias_line="$node localhost"
grep -qxF "$alias_line" "$common/host_aliases" 2>/dev/null || echo "$alias_line" >> "$common/host_aliases"
echo "$node" > "$common/act_qmaster"

qmaster_ok() { qstat -f >/dev/null 2>&1; }
if ! pgrep -x sge_qmaster >/dev/null; then
    /usr/sbin/sge_qmaster </dev/null >/dev/null 2>&1
    how=started
else
    how=reused
fi
wait_for 60 sge_qmaster qmaster_ok || die "sge_qmaster does not answer (see /var/spool/gridengine/qmaster/messages)"

# --- configuration (qconf; each change made once) -------------------------------------------
tmp=$(mktemp -d /tmp/runnerctl-sgecheck.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
qconf -sh 2>/dev/null | grep -qx "$node" || qconf -ah "$node" >/dev/null
qconf -ss 2>/dev/null | grep -qx "$node" || qconf -as "$node" >/dev/null
if ! qconf -sconf global | grep -Eq '^min_uid +0$'; then
    qconf -sconf global | sed -E 's/^(min_uid|min_gid) .*/\1 0/' > "$tmp/global"
    qconf -Mconf "$tmp/global" >/dev/null
fi
if ! qconf -sconf global | grep -q 'accounting_flush_time=00:00:00'; then
    # a test cluster writes each accounting record at once (sge_conf(5): 0 disables the
    # buffering), where the default flush_time of 15 s made every job's qacct wait for it
    qconf -sconf global | sed -E 's/^(reporting_params +)/\1accounting_flush_time=00:00:00 /' > "$tmp/global"
    qconf -Mconf "$tmp/global" >/dev/null
fi
if ! qconf -sc | grep -Eq '^gpu +gpu +INT +<= +YES +JOB '; then  # absent, or per slot (YES) before
    { qconf -sc | grep -v '^#' | grep -v '^gpu '; echo "gpu gpu INT <= YES JOB 0 0"; } > "$tmp/complex"
    qconf -Mc "$tmp/complex" >/dev/null
fi
if ! qconf -se "$node" >/dev/null 2>&1; then
    printf 'hostname %s\nload_scaling NONE\ncomplex_values gpu=8\nuser_lists NONE\nxuser_lists NONE\nprojects NONE\nxprojects NONE\nusage_scaling NONE\nreport_variables NONE\n' \
        "$node" > "$tmp/exechost"
    qconf -Ae "$tmp/exechost" >/dev/null
elif ! qconf -se "$node" | grep -q 'gpu=8'; then
    qconf -rattr exechost complex_values gpu=8 "$node" >/dev/null
fi
if ! qconf -ssconf | grep -Eq '^schedule_interval +0:0:1$'; then  # schedule within a second, not 15 s
    qconf -ssconf | sed -E 's/^schedule_interval .*/schedule_interval 0:0:1/; s/^flush_submit_sec .*/flush_submit_sec 1/; s/^flush_finish_sec .*/flush_finish_sec 1/' > "$tmp/sched"
    qconf -Msconf "$tmp/sched" >/dev/null 2>&1 || die "could not set the scheduler's interval"
fi
for pe in smp mpi; do  # parallel environments: smp on one host, mpi across hosts (tight: qrsh -inherit)
    qconf -sp "$pe" >/dev/null 2>&1 && continue
    rule='$pe_slots'; [ "$pe" = mpi ] && rule='$fill_up'
    printf 'pe_name %s\nslots 999\nuser_lists NONE\nxuser_lists NONE\nstart_proc_args NONE\nstop_proc_args NONE\nallocation_rule %s\ncontrol_slaves TRUE\njob_is_first_task FALSE\nurgency_slots min\naccounting_summary FALSE\nqsort_args NONE\n' \
        "$pe" "$rule" > "$tmp/pe"
    qconf -Ap "$tmp/pe" >/dev/null 2>&1 || die "could not add parallel environment $pe"
done
if ! qconf -sq all.q >/dev/null 2>&1; then  # qconf -aq with an "editor" that sets the host
    printf '#!/bin/sh\nsed -i "s/^hostlist .*/hostlist %s/" "$1"\n' "$node" > "$tmp/edit" && chmod +x "$tmp/edit"
    EDITOR="$tmp/edit" qconf -aq all.q >/dev/null 2>&1 || die "could not add queue all.q"
fi
queue_attr() {  # queue_attr NAME VALUE: set all.q's NAME unless it already is VALUE
    qconf -sq all.q | grep -Eq "^$1 +$2\$" || qconf -rattr queue "$1" "$2" all.q >/dev/null 2>&1
}
queue_attr hostlist "$node"
queue_attr load_thresholds NONE
queue_attr slots 16
queue_attr shell /bin/bash
queue_attr shell_start_mode unix_behavior

if ! pgrep -x sge_execd >/dev/null; then
    /usr/sbin/sge_execd </dev/null >/dev/null 2>&1
    [ "$how" = reused ] && how="reused qmaster, started execd"
fi
host_up() { qhost -h "$node" | awk -v n="$node" '$1 == n && $4 != "-" { ok = 1 } END { exit !ok }'; }
wait_for 60 "execd on $node to report" host_up || die "sge_execd on $node does not report (see /var/spool/gridengine/execd/$node/messages)"
queue_ok() { qstat -f -q "all.q@$node" | awk -v q="all.q@$node" '$1 == q && NF == 5 { ok = 1 } END { exit !ok }'; }
queue_ok || qmod -c "all.q@$node" >/dev/null 2>&1 || true
qmod -e "all.q@$node" >/dev/null 2>&1 || true
wait_for 30 "all.q@$node without alarms" queue_ok || { qstat -f -explain a >&2; die "all.q@$node not usable"; }

# --- checks ----------------------------------------------------------------------------------
cd "$tmp"
rc=0
printf '#!/bin/bash\necho "job=$JOB_ID"\nexit 3\n' > exit3.sh
qsub -sync y -cwd -l gpu=1 -o exit3.out -j y exit3.sh >/dev/null 2>&1 || rc=$?
[ $rc -eq 3 ] || die "qsub -sync y of a job exiting 3 returned $rc"
grep -q '^job=[0-9]' exit3.out || die "the job's output: $(cat exit3.out)"
if qsub -w e -b y -l gpu=9 /bin/true >/dev/null 2>&1; then die "qsub -w e -l gpu=9 was accepted"; fi

echo "setup gridengine: ok ($(qstat -help | head -n 1), host $node gpu=8, daemons $how; qsub -sync/-w e checked; $(elapsed))"
