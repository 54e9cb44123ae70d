#!/usr/bin/env bash
# A real single-node Slurm for the slurm driver's tests: 8 "GPUs" as gres backed by device
# files made with mknod (no NVIDIA hardware needed; Slurm only hands out the files and sets
# CUDA_VISIBLE_DEVICES). SlurmdParameters=config_overrides lets the node claim what
# slurm.conf says (16 CPUs, gpu:8) whatever the machine has. No cgroups, no slurmdbd:
# proctrack/linuxproc, task/none, accounting_storage/none (sacct does not work). A
# finished job's exit code: `scontrol show job ID` (ExitCode=RC:SIG) for MinJobAge=600 s
# after it ends, and for ever in /var/log/slurm/jobcomp.log (jobcomp/filetxt, one line a
# job: JobId=ID ... JobState=... ExitCode=RC:SIG ...).
# Config: /etc/slurm/slurm.conf and gres.conf; partition `gpu` (default) is this host's node
# with gpu:8; partition `multi` is two more nodes, node1 and node2 (gpu:4 each), run by two
# more slurmd on this host (`slurmd -N node1`, each NodeAddr=127.0.0.1 with its own Port,
# and spool, pid, log and TmpFS paths by node name, %n) so `srun -N2` and Open MPI
# (`openmpi-bin`, `srun --mpi=pmix`; pmix needs the per-node TmpFS) run across two nodes.
# Daemons run as root and log to /var/log/slurm/slurmctld.log and slurmd-NODE.log;
# munged runs as user munge.
# Daemons already running are reused (a changed slurm.conf is applied with reconfigure).
set -euo pipefail
. "$(dirname "$0")/common.sh"

apt_install slurm-wlm munge openmpi-bin libpmix-dev python3-mpi4py  # pmix plugin loads libpmix.so

node=$(hostname -s)
for k in 0 1 2 3 4 5 6 7; do [ -e "/dev/nvidia$k" ] || mknod -m 666 "/dev/nvidia$k" c 195 "$k"; done

# --- munge ---------------------------------------------------------------------------------
mkdir -p /etc/munge /run/munge /var/log/munge /var/lib/munge
if [ ! -s /etc/munge/munge.key ]; then
    if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key
    else dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
fi
chown munge:munge /etc/munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key && chmod 755 /run/munge
munge_ok() { munge -n </dev/null | unmunge >/dev/null 2>&1; }
if ! munge_ok; then
    pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged </dev/null
    wait_for 30 munged munge_ok || die "munged does not answer (see /var/log/munge/munged.log)"
fi

# --- config --------------------------------------------------------------------------------
nodes=("$node" node1 node2)
mkdir -p /etc/slurm /var/spool/slurmctld /var/log/slurm
for n in "${nodes[@]}"; do mkdir -p "/var/spool/slurmd/$n/tmp"; done
conf=$(cat <<CONF
# Written by .ci/setup/slurm.sh (runnerctl CI): one node, 8 gres GPUs on mknod devices.
ClusterName=runnerctl-ci
SlurmctldHost=$node
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
TmpFS=/var/spool/slurmd/%n/tmp
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
NodeName=$node CPUs=16 RealMemory=8000 Gres=gpu:8 State=UNKNOWN
NodeName=node1 NodeAddr=127.0.0.1 Port=6831 CPUs=8 RealMemory=4000 Gres=gpu:4 State=UNKNOWN
NodeName=node2 NodeAddr=127.0.0.1 Port=6832 CPUs=8 RealMemory=4000 Gres=gpu:4 State=UNKNOWN
PartitionName=gpu Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
PartitionName=multi Nodes=node1,node2 MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
)
gres=$(printf '%s\n' "NodeName=$node Name=gpu File=/dev/nvidia[0-7]" \
    "NodeName=node1 Name=gpu File=/dev/nvidia[0-3]" "NodeName=node2 Name=gpu File=/dev/nvidia[4-7]")
# rewritten only when different, so their mtimes tell whether running daemons are stale
[ "$(cat /etc/slurm/slurm.conf 2>/dev/null)" = "$conf" ] || printf '%s\n' "$conf" > /etc/slurm/slurm.conf
[ "$(cat /etc/slurm/gres.conf 2>/dev/null)" = "$gres" ] || printf '%s\n' "$gres" > /etc/slurm/gres.conf

# --- daemons -------------------------------------------------------------------------------
ctld_ok() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
# stale DAEMON: it runs but started before slurm.conf/gres.conf last changed, or libpmix-dev came (plugins such as
# JobCompType are read only at start-up, so `scontrol reconfigure` is not enough).
stale() {
    local pid started
    pid=$(pgrep -xo "$1") || return 1
    started=$(( $(date +%s) - $(ps -o etimes= -p "$pid") ))
    [ "$(stat -c %Y /etc/slurm/slurm.conf)" -gt "$started" ] || [ "$(stat -c %Y /etc/slurm/gres.conf)" -gt "$started" ] \
        || [ "$(stat -c %Y /var/lib/dpkg/info/libpmix-dev:amd64.list)" -gt "$started" ]  # pmix loaded at start
}
how=reused
check_jobcomp=1
if stale slurmctld || stale slurmd; then
    if [ "${RUNNERCTL_CI_SLURM_NO_RESTART:-0}" = 1 ]; then
        log "slurm daemons predate slurm.conf; not restarted (RUNNERCTL_CI_SLURM_NO_RESTART=1)"
        scontrol reconfigure || true
        check_jobcomp=0
        how="reused, reconfigured only"
    else
        scontrol shutdown >/dev/null 2>&1 || true       # slurmctld and slurmd; job state is kept
        # slurmctld's shutdown reaches one slurmd per address; the others get SIGTERM (their stop)
        wait_for 10 "slurmctld to stop" sh -c '! pgrep -x slurmctld' || true
        for pid in $(pgrep -x slurmd); do kill -TERM "$pid" 2>/dev/null || true; done
        if ! wait_for 15 "slurmd to stop" sh -c '! pgrep -x slurmd'; then   # one wedged on a step
            for pid in $(pgrep -x slurmd); do kill -KILL "$pid" 2>/dev/null || true; done
        fi
        wait_for 30 "slurm daemons to stop" sh -c '! pgrep -x slurmctld && ! pgrep -x slurmd' \
            || die "slurm daemons did not stop"
        how=restarted
    fi
fi
if ! pgrep -x slurmctld >/dev/null; then
    slurmctld </dev/null >>/var/log/slurm/slurmctld.out 2>&1
    [ "$how" = reused ] && how=started
fi
wait_for 60 slurmctld ctld_ok || { tail -20 /var/log/slurm/slurmctld.log >&2; die "slurmctld"; }
slurmd_running() { pgrep -x slurmd -a | grep -Eq -- "-N $1( |\$)" || { [ "$1" = "$node" ] && pgrep -x slurmd -a | grep -vq -- ' -N '; }; }
for n in "${nodes[@]}"; do
    slurmd_running "$n" || slurmd -N "$n" </dev/null >>/var/log/slurm/slurmd.out 2>&1
done

node_ready() {  # node_ready NAME
    local state
    state=$(sinfo -h -n "$1" -o %T 2>/dev/null) || return 1
    case "$state" in
        idle|mixed|allocated|completing) return 0 ;;
        down|drained|draining|drain) scontrol update nodename="$1" state=resume >/dev/null 2>&1 ;;
    esac
    return 1
}
for n in "${nodes[@]}"; do
    wait_for 60 "node $n to be idle" node_ready "$n" \
        || { sinfo -N -l >&2; tail -20 /var/log/slurm/slurmctld.log "/var/log/slurm/slurmd-$n.log" >&2; die "node $n not ready"; }
done

# --- checks --------------------------------------------------------------------------------
got=$(timeout 120 srun -N1 --gres=gpu:2 env | grep '^CUDA_VISIBLE_DEVICES=' || true)
[[ "$got" =~ ^CUDA_VISIBLE_DEVICES=[0-7],[0-7]$ ]] || die "srun --gres=gpu:2 gave '$got'"

tmp=$(mktemp -d /tmp/runnerctl-slurmcheck.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
job_field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
ended() { case "$(job_field "$1" JobState)" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) return 0;; esac; return 1; }

# a batch job's exit code, from scontrol and from the jobcomp file
id=$(sbatch --parsable --gres=gpu:1 --chdir="$tmp" -o "$tmp/%j.out" --wrap 'echo "gpus=$CUDA_VISIBLE_DEVICES"; exit 3')
wait_for 60 "batch job $id to end" ended "$id" || die "batch job $id did not end"
[ "$(job_field "$id" JobState)/$(job_field "$id" ExitCode)" = "FAILED/3:0" ] \
    || die "job $id: $(job_field "$id" JobState) $(job_field "$id" ExitCode), wanted FAILED 3:0"
grep -q '^gpus=[0-7]$' "$tmp/$id.out" || die "job $id output: $(cat "$tmp/$id.out")"
if [ $check_jobcomp -eq 1 ]; then
    wait_for 10 "job $id in jobcomp.log" grep -q "^JobId=$id .*ExitCode=3:0" /var/log/slurm/jobcomp.log \
        || die "job $id not in /var/log/slurm/jobcomp.log"
fi

# scancel, seen through squeue and scontrol
id=$(sbatch --parsable --gres=gpu:1 --chdir="$tmp" -o /dev/null --wrap 'sleep 300')
wait_for 30 "job $id to run" sh -c "squeue -h -j $id -o %T | grep -q RUNNING" || die "job $id did not start"
scancel "$id"
wait_for 30 "job $id to be cancelled" sh -c "scontrol show job $id | grep -q JobState=CANCELLED" || die "scancel $id"
wait_for 30 "job $id to leave squeue" sh -c "[ -z \"\$(squeue -h -j $id -t all -o %T | grep -v CANCELLED)\" ]" \
    || die "job $id still listed"

# two nodes, and Open MPI across them through pmix
got=$(timeout 120 srun -p multi -N2 printenv SLURMD_NODENAME 2>"$tmp/err" | sort | tr '\n' ' ' || true)
[ "$got" = "node1 node2 " ] || die "srun -p multi -N2 ran on '$got', wanted node1 node2: $(cat "$tmp/err")"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
got=$(timeout 120 srun -p multi -N2 --mpi=pmix printenv PMIX_RANK 2>"$tmp/err" | sort | tr '\n' ' ' || true)
[ "$got" = "0 1 " ] || die "srun -p multi -N2 --mpi=pmix gave PMIx ranks '$got', wanted 0 1: $(cat "$tmp/err")"
got=$(OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo timeout 120 mpirun -np 2 printenv OMPI_COMM_WORLD_SIZE \
      2>&1 | sort -u | tr '\n' ' ' || true)
[ "$got" = "2 " ] || die "mpirun -np 2 over loopback gave world size '$got'"

echo "setup slurm: ok ($(sinfo -V), node $node gpu:8 + node1/node2 gpu:4 in partition multi, daemons $how, srun/sbatch/scancel checked; $(elapsed))"
