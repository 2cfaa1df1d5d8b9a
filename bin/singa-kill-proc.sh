#!/usr/bin/env bash
# Stop process PID of SINGA job JOB_ID on this host:
#
#   singa-kill-proc.sh JOB_ID PID [GRACE [USR1]]
#
# Only a process whose arguments hold "-singa_job JOB_ID" (as singa-run.sh starts them) is
# signalled: SIGTERM, then SIGKILL if it still runs GRACE seconds later (default
# $SINGA_KILL_GRACE, else 10); with USR1, SIGUSR1 once (a snapshot, then the job stops).
# Needs nothing else of SINGA, so a remote host runs it as
# `ssh HOST bash -s -- JOB_ID PID GRACE < singa-kill-proc.sh`.
# Exit status: 0 stopped (or gone already), 2 refused (bad arguments, not the job's process).
set -uo pipefail

job=${1:-} pid=${2:-} grace=${3:-${SINGA_KILL_GRACE:-10}} sig=${4:-TERM}
if ! [[ $job =~ ^[0-9]+$ && $pid =~ ^[1-9][0-9]*$ && $grace =~ ^[0-9]+$ && $sig =~ ^(TERM|USR1)$ ]]; then
  echo "singa-kill-proc: usage: singa-kill-proc.sh JOB_ID PID [GRACE [USR1]] (numbers; PID > 0)" >&2
  exit 2
fi

# True while $pid runs with the arguments "-singa_job $job" (a zombie has none).
of_job() {
  local args=() i
  mapfile -d '' args 2>/dev/null <"/proc/$pid/cmdline" || return 1
  for ((i = 0; i + 1 < ${#args[@]}; i++)); do
    [ "${args[i]}" = -singa_job ] && [ "${args[i + 1]}" = "$job" ] && return 0
  done
  return 1
}

if ! of_job; then
  if [ -n "$(tr -d '\0' 2>/dev/null <"/proc/$pid/cmdline")" ]; then
    echo "singa-kill-proc: pid $pid on $(hostname) is not a process of job $job; not signalled" >&2
    exit 2
  fi
  exit 0
fi
if [ "$sig" = USR1 ]; then
  kill -USR1 "$pid" 2>/dev/null || true
  exit 0
fi
kill -TERM "$pid" 2>/dev/null || exit 0
for ((i = 0; i < grace * 10; i++)); do
  of_job || exit 0
  sleep 0.1
done
kill -KILL "$pid" 2>/dev/null || exit 0
echo "singa-kill-proc: pid $pid of job $job still ran $grace s after SIGTERM; sent SIGKILL" >&2
