#!/usr/bin/env bash
# PostgreSQL server binaries for runnerctl's `postgres` command and its tests. No cluster
# is started here: the tests run initdb/pg_ctl themselves in temporary directories (as
# the `postgres` user when CI runs as root, since PostgreSQL refuses root).
set -euo pipefail
. "$(dirname "$0")/common.sh"
apt_install postgresql
bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
test -x "$bindir/initdb" && test -x "$bindir/pg_ctl"
id postgres >/dev/null
# Debian's package may start its own cluster where a service manager runs; ours need none.
if command -v pg_lsclusters >/dev/null; then
    pg_lsclusters -h 2>/dev/null | awk '$4 == "online" {print $1, $2}' | while read -r v c; do
        pg_ctlcluster "$v" "$c" stop || true
    done
fi
echo "setup postgres: ok ($bindir)"
