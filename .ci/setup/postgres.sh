#!/usr/bin/env bash
# PostgreSQL 15 server binaries for runnerctl's `postgres` command and its tests. No
# cluster is started here: the tests run initdb/pg_ctl themselves in temporary
# directories. Debian keeps them off PATH, in /usr/lib/postgresql/15/bin (`pg_config
# --bindir` prints it).
# initdb and postgres refuse to run as root: as root, run them as the `postgres` user
# (`runuser -u postgres -- BINDIR/initdb -D DIR ...`) on a directory that user owns and
# can reach (every parent directory must be searchable by it; /tmp/pytest-of-root is not).
# This script proves that with a throwaway cluster: initdb, pg_ctl start, psql, stop.
set -euo pipefail
. "$(dirname "$0")/common.sh"

apt_install postgresql
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bindir" ] && [ -x "$bindir/initdb" ] && [ -x "$bindir/pg_ctl" ] || die "no initdb/pg_ctl under /usr/lib/postgresql"
id postgres >/dev/null 2>&1 || die "user postgres missing"

# Debian's postinst creates cluster 15/main; where a service manager ran it may be online.
# Ours need none of it on port 5432.
if command -v pg_lsclusters >/dev/null; then
    pg_lsclusters -h 2>/dev/null | awk '$4 == "online" {print $1, $2}' | while read -r v c; do
        pg_ctlcluster "$v" "$c" stop >/dev/null 2>&1 || true
    done
fi

# Smoke test: a throwaway cluster on a Unix socket only (no TCP port), as `postgres`.
as_pg=()
[ "$(id -u)" -eq 0 ] && as_pg=(runuser -u postgres --)
tmp=$(mktemp -d /tmp/runnerctl-pgcheck.XXXXXX)
cleanup() {
    "${as_pg[@]}" "$bindir/pg_ctl" stop -D "$tmp/data" -m immediate >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT
[ ${#as_pg[@]} -gt 0 ] && chown postgres: "$tmp"
"${as_pg[@]}" "$bindir/initdb" -D "$tmp/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
    >"$tmp/initdb.log" 2>&1 || { tail -20 "$tmp/initdb.log" >&2; die "initdb"; }
"${as_pg[@]}" "$bindir/pg_ctl" start -w -t 60 -D "$tmp/data" -l "$tmp/server.log" \
    -o "-c listen_addresses='' -c unix_socket_directories='$tmp'" >/dev/null \
    || { tail -20 "$tmp/server.log" >&2; die "pg_ctl start"; }
got=$("${as_pg[@]}" "$bindir/psql" -h "$tmp" -U postgres -d postgres -Atc 'select 40 + 2')
[ "$got" = 42 ] || die "psql answered '$got'"
version=$("$bindir/postgres" --version | awk '{print $3}')
cleanup
trap - EXIT
echo "setup postgres: ok (PostgreSQL $version, bindir $bindir, initdb as ${as_pg[*]:-$(id -un)}; $(elapsed))"
