#!/usr/bin/env bash
# Entrypoint of the local dlock-test/postgres image (installed as
# /usr/local/bin/docker-entrypoint.sh). Behaves like the official postgres
# image's entrypoint for what dlock's tests use:
#
# - a first argument that is an option (`-c name=value`) runs postgres with it;
# - `postgres ...` started as root makes $PGDATA and /var/run/postgresql
#   (owned by postgres, modes 0700 and 3775), then runs again as postgres;
# - when $PGDATA holds no cluster yet (no PG_VERSION): initdb as
#   $POSTGRES_USER (default postgres) with the password $POSTGRES_PASSWORD
#   (or the file $POSTGRES_PASSWORD_FILE), `host all all all
#   $POSTGRES_HOST_AUTH_METHOD` (default scram-sha-256) appended to
#   pg_hba.conf, listen_addresses = '*'; then, on a temporary server that
#   listens on the Unix socket only and takes the same arguments, the
#   database $POSTGRES_DB (default $POSTGRES_USER) is created and the
#   /docker-entrypoint-initdb.d/ scripts (*.sh, *.sql) run;
# - a restart with a cluster in $PGDATA starts it as it is.
#
# Then the command runs. One difference: the official image stops with SIGINT
# (STOPSIGNAL, a fast shutdown), which `docker commit` cannot set on Docker
# 20.10, so `docker stop` sends SIGTERM, which postgres would take as a smart
# shutdown that waits for every client to leave. So this entrypoint stays PID 1
# and passes SIGTERM on to postgres as SIGINT (SIGINT, SIGQUIT and SIGHUP as
# they are), and exits with postgres's status.
set -Eeo pipefail

log() { printf '[entrypoint] %s\n' "$*" >&2; }

# VAR or VAR_FILE, as the official image reads its secrets.
file_env() {
	local var=$1 file_var="${1}_FILE" default=${2:-}
	if [ -n "${!var:-}" ] && [ -n "${!file_var:-}" ]; then
		log "error: both $var and $file_var are set (but are exclusive)"
		exit 1
	fi
	local value=$default
	if [ -n "${!var:-}" ]; then
		value=${!var}
	elif [ -n "${!file_var:-}" ]; then
		value=$(<"${!file_var}")
	fi
	export "$var"="$value"
	unset "$file_var"
}

if [ "${1:0:1}" = '-' ]; then
	set -- postgres "$@"
fi

if [ "$1" != 'postgres' ]; then
	exec "$@"
fi

: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

if [ "$(id -u)" = '0' ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chmod 00700 "$PGDATA"
	chmod 03775 /var/run/postgresql
	find "$PGDATA" \! -user postgres -exec chown postgres:postgres '{}' +
	chown postgres:postgres /var/run/postgresql
	exec setpriv --reuid=postgres --regid=postgres --init-groups -- "$BASH_SOURCE" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	file_env POSTGRES_PASSWORD
	file_env POSTGRES_USER postgres
	file_env POSTGRES_DB "$POSTGRES_USER"
	file_env POSTGRES_INITDB_ARGS
	: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
	if [ -z "$POSTGRES_PASSWORD" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != 'trust' ]; then
		log "error: the database is uninitialized and no superuser password is set:"
		log "set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust)"
		exit 1
	fi

	log "initdb in $PGDATA"
	# shellcheck disable=SC2086 # word splitting of the extra arguments is the interface
	initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
		$POSTGRES_INITDB_ARGS
	printf '\n%s\n' "host all all all $POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"
	printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"

	# A temporary server on the Unix socket only: clients see nothing until the real one runs.
	shift
	temp_args=("$@" -c "listen_addresses=" -p "${PGPORT:-5432}")
	PGUSER=$POSTGRES_USER pg_ctl -D "$PGDATA" -o "$(printf '%q ' "${temp_args[@]}")" -w start
	set -- postgres "$@"

	psql_init=(psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --no-psqlrc)
	if [ "$POSTGRES_DB" != 'postgres' ]; then
		"${psql_init[@]}" --dbname postgres --set db="$POSTGRES_DB" <<<'CREATE DATABASE :"db" ;'
	fi
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sh)
			log "running $f"
			if [ -x "$f" ]; then "$f"; else . "$f"; fi
			;;
		*.sql)
			log "running $f"
			"${psql_init[@]}" --dbname "$POSTGRES_DB" -f "$f"
			;;
		*) ;;
		esac
	done

	PGUSER=$POSTGRES_USER pg_ctl -D "$PGDATA" -m fast -w stop
	log "initialized; starting postgres"
fi

"$@" &
pid=$!
trap 'kill -INT "$pid" 2>/dev/null || :' TERM INT
trap 'kill -QUIT "$pid" 2>/dev/null || :' QUIT
trap 'kill -HUP "$pid" 2>/dev/null || :' HUP
while :; do
	# A trapped signal interrupts the wait; wait again until postgres has exited.
	wait "$pid" && status=0 || status=$?
	kill -0 "$pid" 2>/dev/null || break
done
exit "$status"
