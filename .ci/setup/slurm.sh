#!/usr/bin/env bash
# A real single-node Slurm for the slurm driver's tests: 8 "GPUs" as gres backed by
# device files made with mknod (no NVIDIA hardware needed; Slurm only hands out the
# files and sets CUDA_VISIBLE_DEVICES). SlurmdParameters=config_overrides lets the node
# claim what slurm.conf says. No accounting daemon: exit codes come from the job's
# own record (scontrol, kept for MinJobAge) and a file the driver's wrapper writes.
set -euo pipefail
. "$(dirname "$0")/common.sh"
apt_install slurm-wlm munge
node=$(hostname -s)
for k in 0 1 2 3 4 5 6 7; do [ -e "/dev/nvidia$k" ] || mknod "/dev/nvidia$k" c 195 "$k"; done
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
cpus=$(nproc)
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=runnerctl-ci
SlurmctldHost=$node
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmUser=root
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
NodeName=$node CPUs=16 RealMemory=8000 Gres=gpu:8 State=UNKNOWN
PartitionName=gpu Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
echo "Name=gpu File=/dev/nvidia[0-7]" > /etc/slurm/gres.conf
chown munge:munge /etc/munge/munge.key /run/munge 2>/dev/null || true
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 1 60); do
    state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
    case "$state" in idle*|mixed*|allocated*) break ;; esac
    scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
    sleep 1
done
sinfo -h -n "$node" -o %T | grep -Eq 'idle|mixed|allocated' || { tail -20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log; exit 1; }
got=$(srun --gres=gpu:2 -N1 printenv CUDA_VISIBLE_DEVICES)
[ "$got" = "0,1" ] || { echo "srun --gres=gpu:2 gave CUDA_VISIBLE_DEVICES=$got"; exit 1; }
echo "setup slurm: ok ($(sinfo -V), node $node, gpu:8)"
