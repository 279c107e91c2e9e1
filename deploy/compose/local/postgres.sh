#!/bin/sh
# The local stand-in for the `postgres` image's entry point, on Debian's PostgreSQL: on first
# start creates the cluster in $PGDATA with $POSTGRES_USER (password $POSTGRES_PASSWORD, scram
# over TCP) and the database $POSTGRES_DB; then runs the server in the foreground.
set -eu
: "${POSTGRES_USER:?}" "${POSTGRES_PASSWORD:?}" "${POSTGRES_DB:=$POSTGRES_USER}"
PGDATA=${PGDATA:-/var/lib/postgresql/data}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s' "$POSTGRES_PASSWORD" >"$pwfile"
  "$bin/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" --locale=C.UTF-8 \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  "$bin/pg_ctl" -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  "$bin/createdb" -U "$POSTGRES_USER" "$POSTGRES_DB"
  "$bin/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null
  echo "pagewarden-postgres: cluster created in $PGDATA"
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*'
