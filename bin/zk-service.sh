#!/usr/bin/env bash
# Run a local ZooKeeper server for SINGA, from Debian's `zookeeper` package.
#
#   zk-service.sh start|stop|status
#
# Listens on $ZK_ADDRESS (default 127.0.0.1) at the port of zookeeper_host in $SINGA_CONF/singa.conf (ZK_PORT
# overrides). zoo.cfg, data, pid file and log live in $SINGA_HOME/var/zookeeper (ZK_DATA
# overrides). start and stop are idempotent; start returns once the server serves sessions;
# status exits 0 when the server serves, else 3.
# With SINGA_MANAGES_ZK=false (a ZooKeeper run by someone else) start and stop do nothing.
set -euo pipefail

SINGA_BIN=${SINGA_BIN:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
SINGA_HOME=${SINGA_HOME:-$(dirname "$SINGA_BIN")}
SINGA_CONF=${SINGA_CONF:-$SINGA_HOME/conf}
ZK_DATA=${ZK_DATA:-$SINGA_HOME/var/zookeeper}
ZK_ADDRESS=${ZK_ADDRESS:-127.0.0.1}
ZK_START_TIMEOUT=${ZK_START_TIMEOUT:-30}
ZK_JAR=/usr/share/java/zookeeper.jar
MAIN=org.apache.zookeeper.server.ZooKeeperServerMain

die() { echo "zk-service: $*" >&2; exit 1; }

usage() { echo "Usage: zk-service.sh start|stop|status" >&2; exit 1; }

# The port of the first host of zookeeper_host in singa.conf; 2181 when absent.
conf_port() {
  local hosts=""
  if [ -f "$SINGA_CONF/singa.conf" ]; then
    hosts=$(sed -n 's/^[[:space:]]*zookeeper_host[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' \
      "$SINGA_CONF/singa.conf")
    hosts=${hosts%%$'\n'*}     # the first (no pipe to head: pipefail would fail on sed's SIGPIPE)
  fi
  hosts=${hosts%%,*}
  hosts=${hosts%%/*}
  case $hosts in
    *:*) echo "${hosts##*:}" ;;
    *) echo 2181 ;;
  esac
}

# True when the server on $PORT serves: the four-letter word `srvr` gets its version, not "This
# ZooKeeper instance is not currently serving requests". (`ruok` says imok as soon as the port
# listens, before the server has loaded its data: sessions are refused until it has. `srvr` is
# also the one word ZooKeeper's default 4lw.commands.whitelist allows, for a server not ours.)
answers() {
  ( exec 3<>"/dev/tcp/$ZK_ADDRESS/$PORT" || exit 1
    printf srvr >&3
    read -r -t 2 reply <&3 || true
    [[ $reply == "Zookeeper version:"* ]] ) 2>/dev/null
}

# The pid of our running server, from the pid file; empty when it is not running.
running_pid() {
  local pid
  [ -f "$PID_FILE" ] || return 0
  pid=$(cat "$PID_FILE")
  if [[ $pid =~ ^[0-9]+$ ]] && [[ "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" == *"$MAIN"* ]]; then
    echo "$pid"
  fi
}

start() {
  local pid
  pid=$(running_pid)
  if [ -n "$pid" ]; then
    echo "ZooKeeper already running (pid $pid, $ZK_ADDRESS:$PORT)"
    return 0
  fi
  if answers; then
    echo "a ZooKeeper already answers on $ZK_ADDRESS:$PORT (not started by this script)"
    return 0
  fi
  command -v java >/dev/null || die "java not found; run thirdparty/install.sh (it installs Debian's zookeeper)"
  [ -f "$ZK_JAR" ] || die "$ZK_JAR not found; run thirdparty/install.sh (it installs Debian's zookeeper)"
  mkdir -p "$ZK_DATA/data"
  cat >"$ZK_DATA/zoo.cfg" <<EOF
# written by bin/zk-service.sh
tickTime=2000
dataDir=$ZK_DATA/data
clientPort=$PORT
clientPortAddress=$ZK_ADDRESS
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=*
autopurge.snapRetainCount=3
autopurge.purgeInterval=1
EOF
  # zookeeper.jar's manifest names its dependencies; slf4j-simple makes it log (to the log file).
  local cp=$ZK_JAR
  [ -f /usr/share/java/slf4j-simple.jar ] && cp=$cp:/usr/share/java/slf4j-simple.jar
  echo "Starting ZooKeeper on $ZK_ADDRESS:$PORT (data and log in $ZK_DATA)"
  # setsid: the server outlives the shell (and its Ctrl-C) that started it.
  setsid java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -Dzookeeper.admin.enableServer=false -cp "$cp" "$MAIN" "$ZK_DATA/zoo.cfg" \
    >>"$LOG_FILE" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$PID_FILE"
  local waited=0
  until answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$PID_FILE"
      die "ZooKeeper exited at start; last lines of $LOG_FILE: $(tail -n 3 "$LOG_FILE" | tr '\n' ' ')"
    fi
    if [ "$waited" -ge $((ZK_START_TIMEOUT * 5)) ]; then
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$PID_FILE"
      die "ZooKeeper did not answer on $ZK_ADDRESS:$PORT within $ZK_START_TIMEOUT s; see $LOG_FILE"
    fi
    sleep 0.2
    waited=$((waited + 1))
  done
  echo "ZooKeeper running (pid $pid, $ZK_ADDRESS:$PORT)"
}

stop() {
  local pid i
  pid=$(running_pid)
  if [ -z "$pid" ]; then
    rm -f "$PID_FILE"
    echo "ZooKeeper not running (no live pid in $PID_FILE)"
    return 0
  fi
  kill "$pid"
  for i in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  rm -f "$PID_FILE"
  echo "ZooKeeper stopped (pid $pid)"
}

status() {
  local pid
  pid=$(running_pid)
  if answers; then
    echo "ZooKeeper answers on $ZK_ADDRESS:$PORT${pid:+ (pid $pid)}"
  else
    echo "ZooKeeper not running on $ZK_ADDRESS:$PORT"
    return 3
  fi
}

[ $# -eq 1 ] || usage
if [ "${SINGA_MANAGES_ZK:-true}" != true ] && [ "$1" != status ]; then
  echo "SINGA_MANAGES_ZK=$SINGA_MANAGES_ZK: ZooKeeper is run outside SINGA; nothing to $1"
  exit 0
fi
PORT=${ZK_PORT:-$(conf_port)}
[[ $PORT =~ ^[0-9]+$ ]] || die "bad ZooKeeper port '$PORT'"
mkdir -p "$ZK_DATA"
ZK_DATA=$(cd "$ZK_DATA" && pwd)
PID_FILE=$ZK_DATA/zookeeper.pid
LOG_FILE=$ZK_DATA/zookeeper.log
case $1 in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) usage ;;
esac
