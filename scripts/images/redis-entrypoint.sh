#!/bin/sh
# Entrypoint of the local dlock-test/redis image (installed as
# /usr/local/bin/docker-entrypoint.sh). Behaves like the official redis
# image's entrypoint, plus one difference of the binaries: the official image
# compiles redis with protected-mode off by default, Debian's redis-server has
# it on, so we pass `--protected-mode no` first; a later option on the command
# line still wins.
set -e

# First argument is `-f`/`--some-option` or `something.conf`: run redis-server.
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
	set -- redis-server "$@"
fi

# Start as root: fix ownership of the working directory, then drop to `redis`.
if [ "$1" = 'redis-server' ] && [ "$(id -u)" = '0' ]; then
	find . \! -user redis -exec chown redis '{}' +
	exec setpriv --reuid=redis --regid=redis --clear-groups -- "$0" "$@"
fi

if [ "$1" = 'redis-server' ]; then
	case "${2-}" in
	-v | --version | -h | --help | --test-memory | --check-system | -) ;;
	'' | -*)
		shift
		set -- redis-server --protected-mode no "$@"
		;;
	*)
		# $2 is a configuration file: options must follow it.
		conf=$2
		shift 2
		set -- redis-server "$conf" --protected-mode no "$@"
		;;
	esac
fi

um="$(umask)"
if [ "$um" = '0022' ]; then
	umask 0077
fi

exec "$@"
