#!/usr/bin/env bash
# Manage running SINGA jobs: list them, view their processes, kill one.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/singa-env.sh"

usage() {
  cat >&2 <<USAGE
Usage: singa-console.sh <command>
  list       list running jobs
  view ID    view the processes of job ID (host|pid), then its latest step and metrics
  kill ID    stop the processes of job ID (SIGTERM, SIGKILL after SINGA_KILL_GRACE s)
USAGE
  exit 1
}

check_job_id() {
  [[ $1 =~ ^[0-9]+$ ]] || { echo "singa-console: job id must be a number, not '$1'" >&2; exit 1; }
}

# Stop process $3 of job $1 on host $2 (singa-kill-proc.sh: only if it is one of the job's),
# here when the host is this machine, else over ssh. Host and pid come from ZooKeeper, which
# anyone who reaches it may write: both are checked first. Run with & (it execs the kill, so
# the pid kept is the kill's own).
kill_proc() {
  local job=$1 host=$2 pid=$3
  if ! valid_host "$host"; then
    echo "singa-console: job $job: bad host name '$host' in ZooKeeper; not signalled" >&2
    return 2
  fi
  if ! [[ $pid =~ ^[1-9][0-9]*$ ]]; then
    echo "singa-console: job $job: bad pid '$pid' of host $host in ZooKeeper; not signalled" >&2
    return 2
  fi
  case $host in
    localhost|127.*|"$(hostname)") exec "$SINGA_BIN/singa-kill-proc.sh" "$job" "$pid" ;;
    *) exec "${SINGA_SSH[@]}" -- "$host" bash -s -- "$job" "$pid" "${SINGA_KILL_GRACE:-10}" \
         <"$SINGA_BIN/singa-kill-proc.sh" ;;     # bounded: singa-env.sh's connect and keep-alives
  esac
}

[ $# -ge 1 ] || usage
case $1 in
  list)
    [ $# -eq 1 ] || usage
    singatool list -confdir "$SINGA_CONF" ;;
  view)
    [ $# -eq 2 ] || usage
    check_job_id "$2"
    singatool view "$2" -confdir "$SINGA_CONF"
    singatool progress "$2" -confdir "$SINGA_CONF" ;;
  kill)
    [ $# -eq 2 ] || usage
    check_job_id "$2"
    procs=$(singatool view "$2" -confdir "$SINGA_CONF")
    kills=()
    # stopped itself (bin/singa-run.sh ends a kill that outlasts its wait), it ends its kills
    trap 'kill "${kills[@]}" 2>/dev/null || true' EXIT
    trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM
    while IFS= read -r proc; do      # all at once: each may wait out its grace period
      [ -n "$proc" ] || continue
      echo "kill ${proc%|*} pid ${proc##*|}"
      kill_proc "$2" "${proc%|*}" "${proc##*|}" &
      kills+=($!)
    done <<<"$procs"
    status=0
    for k in "${kills[@]}"; do wait "$k" || status=1; done
    kills=()
    singatool remove "$2" -confdir "$SINGA_CONF"
    exit $status ;;
  *) usage ;;
esac
