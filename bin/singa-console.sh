#!/usr/bin/env bash
# Manage running SINGA jobs: list them, view their processes, kill one.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/singa-env.sh"

usage() {
  cat >&2 <<USAGE
Usage: singa-console.sh <command>
  list       list running jobs
  view ID    view the processes of job ID (host|pid)
  kill ID    kill the processes of job ID
USAGE
  exit 1
}

# Kill process $2 on host $1: here when the host is this machine, else over ssh.
kill_proc() {
  case $1 in
    localhost|127.*|"$(hostname)") kill -9 "$2" 2>/dev/null || true ;;
    *) ssh -oStrictHostKeyChecking=no -oUserKnownHostsFile=/dev/null -oLogLevel=quiet "$1" \
         "kill -9 $2" || true ;;
  esac
}

[ $# -ge 1 ] || usage
case $1 in
  list)
    [ $# -eq 1 ] || usage
    $SINGATOOL list -confdir "$SINGA_CONF" ;;
  view)
    [ $# -eq 2 ] || usage
    $SINGATOOL view "$2" -confdir "$SINGA_CONF" ;;
  kill)
    [ $# -eq 2 ] || usage
    procs=$($SINGATOOL view "$2" -confdir "$SINGA_CONF")
    for proc in $procs; do
      echo "kill ${proc%|*} pid ${proc##*|}"
      kill_proc "${proc%|*}" "${proc##*|}"
    done
    $SINGATOOL remove "$2" -confdir "$SINGA_CONF" ;;
  *) usage ;;
esac
