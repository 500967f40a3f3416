#!/bin/bash
# Stand-in for ZooKeeper's bin/zkServer.sh in the local dlock-test/zookeeper
# image (installed as /usr/local/bin/zkServer.sh), running Debian's ZooKeeper.
# Supports: start-foreground [CFG], print-cmd [CFG], status [CFG], version.
#
# Class path: zookeeper.jar's manifest names its dependencies (jline, only for
# zkCli's interactive mode, is missing); add only slf4j-simple as the one SLF4J
# binding (logs to stderr, i.e. `docker logs`) and servlet-api, which the
# Jetty AdminServer needs (port 8080, ZOO_ADMINSERVER_ENABLED=true).
# Never put every jar of /usr/share/java on it: several SLF4J bindings and
# bridges there abort start-up.
# Heap: -Xmx${ZK_SERVER_HEAP}m, default 256 (the upstream script uses 1000);
# extra JVM options from SERVER_JVMFLAGS and JVMFLAGS, as upstream.
set -euo pipefail

ZOOCFGDIR=${ZOOCFGDIR:-${ZOO_CONF_DIR:-/conf}}
ZOOCFG="$ZOOCFGDIR/zoo.cfg"
if [[ -n "${2-}" ]]; then
    case "$2" in
    */*) ZOOCFG=$2 ;;
    *) ZOOCFG="$ZOOCFGDIR/$2" ;;
    esac
fi
if [[ -f "$ZOOCFGDIR/java.env" ]]; then
    # shellcheck disable=SC1091
    . "$ZOOCFGDIR/java.env"
fi
ZOO_LOG_DIR=${ZOO_LOG_DIR:-/logs}
CLASSPATH="$ZOOCFGDIR:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar:/usr/share/java/servlet-api.jar${CLASSPATH:+:$CLASSPATH}"
ZK_SERVER_HEAP=${ZK_SERVER_HEAP:-256}

# Client port: clientPort= or the `;port` / `;host:port` of this server's line.
client_port() {
    local port myid line dataDir
    port=$(sed -n 's/^[[:space:]]*clientPort[[:space:]]*=[[:space:]]*\([0-9]*\).*/\1/p' "$ZOOCFG" | tail -n1)
    if [[ -z $port ]]; then
        dataDir=$(sed -n 's/^[[:space:]]*dataDir[[:space:]]*=[[:space:]]*//p' "$ZOOCFG" | tail -n1)
        myid=$(cat "${dataDir:-/data}/myid" 2>/dev/null || echo 1)
        line=$(grep -E "^[[:space:]]*server\.${myid}[[:space:]]*=" "$ZOOCFG" | tail -n1 || true)
        if [[ $line == *';'* ]]; then
            port=${line##*;}
            port=${port##*:}
        fi
    fi
    echo "${port:-2181}"
}

cmd=(java
    "-Dzookeeper.log.dir=$ZOO_LOG_DIR"
    "-Dzookeeper.log.file=zookeeper-server.log"
    -Dorg.slf4j.simpleLogger.showDateTime=true
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd HH:mm:ss,SSS"
    -XX:+HeapDumpOnOutOfMemoryError "-XX:OnOutOfMemoryError=kill -9 %p"
    -cp "$CLASSPATH"
    "-Xmx${ZK_SERVER_HEAP}m")
# shellcheck disable=SC2206
cmd+=(${SERVER_JVMFLAGS-} ${JVMFLAGS-})
cmd+=(org.apache.zookeeper.server.quorum.QuorumPeerMain "$ZOOCFG")

case "${1-}" in
start-foreground)
    echo "Using config: $ZOOCFG" >&2
    exec "${cmd[@]}"
    ;;
print-cmd)
    printf '%q ' "${cmd[@]}"
    echo
    ;;
status)
    port=$(client_port)
    exec 3<>"/dev/tcp/127.0.0.1/$port"
    printf 'srvr' >&3
    out=$(cat <&3)
    exec 3>&-
    if [[ $out == *Mode:* ]]; then
        echo "Client port found: $port."
        grep '^Mode: ' <<<"$out"
    else
        echo "Error contacting service on port $port: ${out:-no answer}" >&2
        exit 1
    fi
    ;;
version)
    exec java -cp "$CLASSPATH" org.apache.zookeeper.version.VersionInfoMain
    ;;
*)
    echo "Usage: $0 {start-foreground|print-cmd|status|version} [CFG]" >&2
    exit 1
    ;;
esac
