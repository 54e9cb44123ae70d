#!/usr/bin/env bash
# Optuna on a batch system with the database inside the job: no node spent on it.
#
#   optuna-in-job.sh STUDY TRIALS WORKER_COMMAND...
#
# Run as the script of a multi-node batch job (RUNNERCTL_NODES=N, docs/hpc.md). On the
# first node it starts PostgreSQL (`runnerctl postgres`, data directory in the job's
# scratch space $RUNNERCTL_SCRATCH, default /tmp, listening on $MASTER_ADDR), creates the
# study, then runs WORKER_COMMAND once on every node ($RUNNERCTL_EACH_NODE) with
# OPTUNA_STORAGE, OPTUNA_STUDY_NAME and OPTUNA_N_TRIALS set (runnerctl.optuna.run_worker
# reads them: workers stop when the study holds TRIALS complete trials); the workers
# retry until the database answers. At the end the database is dumped to
# $OPTUNA_DUMP_DIR (default ./artifacts) as optuna-STUDY.sql, and the server stopped.
# A dump already there (OPTUNA_DUMP_DIR on the shared file system, or a previous job's
# artifacts) is loaded first: the study goes on with its trials, up to TRIALS in all.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 STUDY TRIALS WORKER_COMMAND..." >&2; exit 2; }
study=$1 trials=$2
shift 2
: "${MASTER_ADDR:?run this in a runnerctl batch job (MASTER_ADDR is not set)}"
dump_dir=${OPTUNA_DUMP_DIR:-$PWD/artifacts}
scratch=${RUNNERCTL_SCRATCH:-/tmp}/runnerctl-optuna-$MASTER_PORT
mkdir -p "$scratch" "$dump_dir"
chmod 755 "$scratch"   # the server runs as the postgres user
pg=(runnerctl postgres --dir "$scratch" --listen "$MASTER_ADDR" --port $(( MASTER_PORT + 1 )))
"${pg[@]}" init >/dev/null
"${pg[@]}" start >/dev/null
trap '"${pg[@]}" stop >/dev/null; rm -rf "$scratch"' EXIT
url=$("${pg[@]}" create-study --kind rdb --host "$MASTER_ADDR" "$study" | tail -n 1)  # RDB tables: the dump is readable without runnerctl
dburl=${url#journal+}  # runnerctl journal storage or RDB: both are one PostgreSQL database
dump=$dump_dir/optuna-$study.sql
if [ -s "$dump" ]; then  # written with --clean: it replaces the new study's empty tables
    psql --quiet -v ON_ERROR_STOP=1 --dbname="${dburl/+psycopg/}" --file="$dump" >/dev/null
    echo "optuna-in-job: study $study resumed from $dump"
fi
echo "optuna-in-job: study $study on $MASTER_ADDR, $trials trials over $WORLD_SIZE nodes"
export OPTUNA_STORAGE=$url OPTUNA_STUDY_NAME=$study OPTUNA_N_TRIALS=$trials
"$RUNNERCTL_EACH_NODE" "$@"
pg_dump --clean --if-exists --dbname="${dburl/+psycopg/}" --file="$dump.tmp"
mv "$dump.tmp" "$dump"  # a job killed while dumping leaves the last whole dump
echo "optuna-in-job: database dumped to $dump"
