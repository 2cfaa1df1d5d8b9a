#!/usr/bin/env bash
# Launch a SINGA job (SINGA's bin/singa-run.sh):
#
#   singa-run.sh -conf <job.conf> [-exec <program>] [-resume] [-test] [-oversubscribe]
#                [-user_proto <file.proto>]... [-user_layers <file.py>]... [other args]
#   singa-run.sh -exec <script.py> [args]     # a Python job script (the Python API)
#
# A Python script runs with the venv's python in the SINGA home, with the other arguments (and
# -conf when given); its one-process jobs need no ZooKeeper (docs/python.md).
#
# Installs what is missing (thirdparty/install.sh), checks the conf and how many processes it
# puts on each host (`<program> -check`; -oversubscribe allows more than 4 per core; and the
# GPUs those on this host take), starts the local ZooKeeper when conf/singa.conf names a local
# one that does not answer, gets a job id, and starts one process per host of the job (ssh for
# remote hosts; a host's second process on gets its -host_rank, GPUs of its own: docs/gpu.md).
# Other arguments go to the program. SIGINT, SIGTERM or SIGHUP stops every process of the job
# (SIGKILL for those still running SINGA_KILL_GRACE seconds later, default 10) and exits with
# 128 + the signal; SIGUSR1 has the job write a snapshot a step or two later and stop there
# (exit 138), so that -resume loses nothing. With max_restarts, a lost worker-only process of
# an asynchronous job restarts alone and rejoins it (docs/distributed.md). Whichever way it
# ends (the job's end, a lost host, a failure with or without a restart, a signal, an error),
# nothing it started in the background runs on.
set -euo pipefail
SINGA_BIN=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SINGA_HOME=$(dirname "$SINGA_BIN")

usage() { echo "Usage: singa-run.sh -conf <job.conf> [-exec <program>] [-resume] [-test] | -exec <script.py> [args]" >&2; exit 2; }

exe=(); conf=""; args=()
while [ $# -gt 0 ]; do
  case $1 in
    -exec) [ $# -ge 2 ] || usage; exe=("$2"); shift 2 ;;
    -conf) [ $# -ge 2 ] || usage; conf=$2; shift 2 ;;
    -user_proto|-user_layers) [ $# -ge 2 ] || usage; args+=("$1" "$(realpath -m -- "$2")"); shift 2 ;;
    -h|--help) usage ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ ${#exe[@]} -gt 0 ] && [[ ${exe[0]} == *.py ]]; then
  script=${exe[0]}
  [ -f "$script" ] || script=$SINGA_HOME/${exe[0]}
  [ -f "$script" ] || { echo "singa-run: ${exe[0]} not exists" >&2; exit 2; }
  script=$(cd "$(dirname "$script")" && pwd)/$(basename "$script")
  if [ -n "$conf" ]; then
    [ -f "$conf" ] || { echo "singa-run: $conf not exists" >&2; exit 2; }
    args+=(-conf "$(cd "$(dirname "$conf")" && pwd)/$(basename "$conf")")
  fi
  "$SINGA_HOME/thirdparty/install.sh" --quiet
  . "$SINGA_BIN/singa-env.sh"
  cd "$SINGA_HOME"
  exec "$PYTHON" "$script" "${args[@]}"
fi
[ -n "$conf" ] || usage
[ -f "$conf" ] || { echo "singa-run: $conf not exists" >&2; exit 2; }
conf=$(cd "$(dirname "$conf")" && pwd)/$(basename "$conf")

"$SINGA_HOME/thirdparty/install.sh" --quiet
. "$SINGA_BIN/singa-env.sh"
cd "$SINGA_HOME"
[ ${#exe[@]} -gt 0 ] || exe=("$PYTHON" -m singa.driver)
grace=${SINGA_KILL_GRACE:-10}
[[ $grace =~ ^[0-9]+$ ]] || { echo "singa-run: SINGA_KILL_GRACE must be whole seconds, not '$grace'" >&2; exit 2; }

# Nothing outlives the launcher. Whatever runs in the background is this shell's own child,
# started as a command (a function started with & is a subshell: a kill of its pid would leave
# the command an orphan): the job's processes (local_pids, and remote_pids: their ssh clients)
# and the helpers (the watcher, the kill of remote processes). The EXIT trap, which every way
# out passes (an exit, a signal's trap, an error under set -e), stops the job's processes still
# running (only an unexpected exit leaves any: stop_job) and ends the helpers (end_helpers).
job_id=""; local_pids=(); remote_pids=(); remote_hosts=(); helpers=(); watcher=""; slurm_step=""
# True while $1 runs as this shell's child (not a zombie; a pid reused by another process is not ours)
ours() {
  local stat
  read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
  stat=${stat##*) }     # after "pid (command) ": state, parent pid, ...
  [[ $stat =~ ^([A-Za-z])\ ([0-9]+) ]] && [ "${BASH_REMATCH[1]}" != Z ] && [ "${BASH_REMATCH[2]}" = $$ ]
}
# SIGTERM to the helpers still running, SIGKILL to those running SINGA_KILL_GRACE s later;
# returns once none runs
end_helpers() {
  local deadline=$((SECONDS + grace)) pid alive
  for pid in "${helpers[@]}"; do ! ours "$pid" || kill -TERM "$pid" 2>/dev/null || true; done
  while :; do
    alive=()
    for pid in "${helpers[@]}"; do ! ours "$pid" || alive+=("$pid"); done
    [ ${#alive[@]} -gt 0 ] || break
    if [ $SECONDS -ge $deadline ]; then
      kill -KILL "${alive[@]}" 2>/dev/null || true
      wait "${alive[@]}" 2>/dev/null || true
      break
    fi
    sleep 0.1
  done
  helpers=(); watcher=""
}
leave() {
  local rc=$? pid
  trap '' INT TERM HUP
  for pid in "${local_pids[@]}" "${remote_pids[@]}"; do
    if ours "$pid"; then stop_job "exiting (status $rc)"; break; fi
  done
  end_helpers
  exit $rc
}
trap leave EXIT

# The rank of process $2 on its host: how many earlier lines of the job's host list $1
# (job.hosts: a host a line, the processes in order) name its host (singa -host_rank)
host_rank() {
  awk -v i="$2" 'NF { if (n++ == i) { print seen[$1] + 0; exit } seen[$1]++ }' "$1"
}

# The whole conf, once, before anything starts (a mistake: one line, exit 2). Inside a Slurm
# allocation Slurm places the processes: no hostfile (there may be none), no load per host.
check=(-check)
[ -z "${SLURM_JOB_ID:-}" ] || check+=(-oversubscribe)
"${exe[@]}" "${check[@]}" "${args[@]}" -singa_conf "$SINGA_CONF/singa.conf" -conf "$conf"

# The embedded default: a local ZooKeeper where nothing listens is started here. Otherwise the
# check waits for a session as long as zk-service.sh waits for its own server's start
# (ZK_START_TIMEOUT, default 30 s, saying so after a second): a server listens before it
# serves, and on a loaded machine that takes seconds (3 s was once too short under Slurm).
zk_hosts=$(singatool getzkhost -confdir "$SINGA_CONF")
zk_wait=${ZK_START_TIMEOUT:-30}
[[ $zk_wait =~ ^[1-9][0-9]*$ ]] || { echo "singa-run: ZK_START_TIMEOUT must be whole seconds, not '$zk_wait'" >&2; exit 2; }
case $zk_hosts in localhost:*|127.0.0.1:*) zk_local=(-local) ;; *) zk_local=() ;; esac
if ! singatool waitzk "$zk_wait" "${zk_local[@]}" -confdir "$SINGA_CONF" |
     while IFS= read -r line; do echo "singa-run: $line" >&2; done; then
  if [ ${#zk_local[@]} -gt 0 ]; then
    "$SINGA_BIN/zk-service.sh" start
    echo "singa-run: the local ZooKeeper keeps running for later jobs; bin/zk-service.sh stop stops it"
  else
    echo "singa-run: ZooKeeper at $zk_hosts does not answer (waited $zk_wait s for a session)" >&2; exit 1
  fi
fi

# max_restarts (ours): a failed job starts again from its newest complete snapshot.
test_flag=()
for arg in "${args[@]}"; do [ "$arg" != -test ] || test_flag=(-test); done
max_restarts=$(singatool maxrestarts "$conf" "${test_flag[@]}" 2>/dev/null) || max_restarts=0
elastic=""
[ ${#test_flag[@]} -gt 0 ] || elastic=$(singatool elastic "$conf" 2>/dev/null) || elastic=""
restarts=0; proc_restarts=()
while :; do
  # a secret per run (singa/comm/trust.py): the keys of the job's tcp traffic and of its znodes;
  # processes here get it in their environment, those over ssh on their standard input
  SINGA_JOB_SECRET=$(singatool newsecret)
  export SINGA_JOB_SECRET
  job_id=$(singatool create -confdir "$SINGA_CONF")
  echo "Unique JOB_ID is $job_id"
  log_dir="$SINGA_LOG/job-info/job-$job_id-$(date +%Y%m%d-%H%M%S)"
  mkdir -p "$log_dir"
  echo "Record job information to $log_dir"
  cp "$conf" "$log_dir/job.conf"
  echo "$(hostname) $$" >"$log_dir/launcher"     # singa-console.sh list: gone while the job runs
  if [ -z "${SLURM_JOB_ID:-}" ]; then
    singatool genhost "$conf" -confdir "$SINGA_CONF" >"$log_dir/job.hosts"
    while read -r host _; do
      [ -z "$host" ] || valid_host "$host" || { echo "singa-run: bad host name '$host' in $SINGA_CONF/hostfile" >&2; exit 2; }
    done <"$log_dir/job.hosts"
  fi

  # SIGINT/SIGTERM/SIGHUP (the trap exits 128 + the signal after it): SIGTERM to the processes
  # started here; remote ones are stopped through their pids in ZooKeeper (singa-console.sh
  # kill, at once, even when their ssh clients have ended: a terminal hangup signals those too;
  # again while their ssh runs: a process may register late); whatever still runs after the
  # grace period gets SIGKILL. The kill's ssh is bounded (singa_ssh) and so is the wait for it.
  stop_job() {
    trap '' INT TERM HUP
    echo "singa-run: $1: stopping job $job_id" >&2
    [ -z "$watcher" ] || kill "$watcher" 2>/dev/null || true
    if [ -n "$slurm_step" ]; then signal_step TERM; else kill -TERM "${local_pids[@]}" 2>/dev/null || true; fi
    local deadline=$((SECONDS + grace)) killer="" alive pid
    if [ ${#remote_hosts[@]} -gt 0 ] || [ -n "${detached[*]// /}" ]; then
      "$SINGA_BIN/singa-console.sh" kill "$job_id" >/dev/null 2>&1 &
      killer=$!; helpers+=("$killer")
    fi
    while :; do
      alive=()
      for pid in "${local_pids[@]}" "${remote_pids[@]}"; do
        ! kill -0 "$pid" 2>/dev/null || alive+=("$pid")
      done
      [ ${#alive[@]} -gt 0 ] || break
      if [ $SECONDS -ge $deadline ]; then
        kill -KILL "${alive[@]}" 2>/dev/null || true
        break
      fi
      if [ ${#remote_pids[@]} -gt 0 ] && { [ -z "$killer" ] || ! kill -0 "$killer" 2>/dev/null; }; then
        "$SINGA_BIN/singa-console.sh" kill "$job_id" >/dev/null 2>&1 &
        killer=$!; helpers+=("$killer")
      fi
      sleep 0.2
    done
    deadline=$((SECONDS + grace + 20))      # the kill's ssh connect (10 s) and its grace
    while [ -n "$killer" ] && kill -0 "$killer" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
      sleep 0.2
    done
    end_helpers
    singatool remove "$job_id" -confdir "$SINGA_CONF" 2>/dev/null || true
  }
  # Slurm: srun itself must not be signalled (it would kill the tasks at once): the step is
  signal_step() {
    local step
    for step in $(squeue -h -s -j "$SLURM_JOB_ID" -o "%i %j" 2>/dev/null | awk -v n="$slurm_step" '$2 == n {print $1}'); do
      scancel --signal="$1" "$step" 2>/dev/null || true
    done
  }
  # job.pids (SINGA's): the processes registered in ZooKeeper, "host|pid" each, SIGUSR1's list;
  # read again every 2 s until every process is in it. The view is read whole: under pipefail a
  # `| head` fails when head leaves before the view's last line is written, and a failure here
  # would end the launcher (set -e).
  list_pids() {
    local procs
    pids_at=$((SECONDS + 2))
    procs=$(singatool view "$job_id" -confdir "$SINGA_CONF" 2>/dev/null) || return 0
    [ -z "$procs" ] || printf '%s\n' "$procs" >"$log_dir/job.pids"
    if [ -n "$nprocs" ] && [ "$(grep -c . <<<"$procs")" -ge "$nprocs" ]; then pids_listed=1; fi
  }
  # SIGUSR1: a snapshot, then the job stops (one process told is enough: its stub tells the
  # others); here a local process, else over ssh the first of job.pids, read again from
  # ZooKeeper first (its last list while ZooKeeper is away; singa-kill-proc.sh refuses a pid
  # no longer the job's).
  snapshot_job() {
    echo "singa-run: SIGUSR1: job $job_id stops after a snapshot" >&2
    snapshot=1
    if [ -n "$slurm_step" ]; then
      signal_step USR1
    elif [ ${#local_pids[@]} -gt 0 ]; then
      kill -USR1 "${local_pids[@]}" 2>/dev/null || true
    else
      local proc=""
      list_pids
      read -r proc 2>/dev/null <"$log_dir/job.pids" || true
      if [ -z "$proc" ]; then
        echo "singa-run: SIGUSR1: no process of job $job_id is known (ZooKeeper away before any registered); no snapshot asked" >&2
        snapshot=""
        return
      fi
      singa_ssh -- "${proc%|*}" bash -s -- "$job_id" "${proc##*|}" 0 USR1 \
        <"$SINGA_BIN/singa-kill-proc.sh" || true
    fi
  }
  local_pids=(); remote_pids=(); remote_hosts=(); watcher=""; snapshot=""; slurm_step=""
  nprocs=""; pids_listed=""; pids_at=0
  proc_pid=(); proc_host=(); frozen_at=(); detached=(); ended_rc=(); polled=(); os_pid=()
  rc_whole=""
  trap 'stop_job SIGINT; exit 130' INT
  trap 'stop_job SIGTERM; exit 143' TERM
  trap 'stop_job SIGHUP; exit 129' HUP       # a terminal hangup: nothing may train on as an orphan
  trap 'snapshot_job' USR1

  # Process $1 of the job (its -procs_id) on host $2, with the flags that follow (-rejoin);
  # past the first on its host, with its -host_rank (the GPUs it takes)
  start_proc() {
    local i=$1 host=$2 remote rank ranked=()
    shift 2
    rank=$(host_rank "$log_dir/job.hosts" "$i")
    [ "$rank" -eq 0 ] || ranked=(-host_rank "$rank")
    if [ "$host" = localhost ]; then
      echo "Executing : ${cmd[*]}${ranked[*]:+ ${ranked[*]}} -procs_id $i${*:+ $*}"
      (exec "${cmd[@]}" "${ranked[@]}" -procs_id "$i" "$@") &
      local_pids+=($!)
    else
      remote="IFS= read -r SINGA_JOB_SECRET && export SINGA_JOB_SECRET && cd $(printf %q "$SINGA_HOME") && source $(printf %q "$SINGA_HOME/conf/profile") && $(printf '%q ' "${cmd[@]}" "${ranked[@]}" -procs_id "$i" "$@")-host $(printf %q "$host")"
      # singa-env.sh's ssh: SINGA_SSH_OPTS, keep-alives (a host that stops answering ends its
      # ssh within 15 s), a bounded connect
      "${SINGA_SSH[@]}" -- "$host" "$remote" <<<"$SINGA_JOB_SECRET" &
      remote_pids+=($!); remote_hosts+=("$host")
    fi
    proc_pid[$i]=$!; proc_host[$i]=$host
  }
  # The pid $1, ended and waited for, leaves the lists of the job's processes
  forget_pid() {
    local kept=() hosts=() k
    for k in "${local_pids[@]}"; do [ "$k" = "$1" ] || kept+=("$k"); done
    local_pids=("${kept[@]}"); kept=()
    for k in "${!remote_pids[@]}"; do
      [ "${remote_pids[$k]}" = "$1" ] || { kept+=("${remote_pids[$k]}"); hosts+=("${remote_hosts[$k]}"); }
    done
    remote_pids=("${kept[@]}"); remote_hosts=("${hosts[@]}")
  }
  # Elastic processes (singatool elastic: an asynchronous job's worker-only processes): one
  # that fails while the processes holding servers run restarts alone (-rejoin, max_restarts
  # times per process; $log_dir/restarts lists them for singa-console.sh list); its groups
  # join the running job again. Past max_restarts, or on bad input, the job stops.
  # A local one stopped (SIGSTOP) for longer than its ZooKeeper session (zk.SESSION_TIMEOUT,
  # 10 s, and a margin) can never go on: it is killed, and restarted like one that failed.
  check_elastic() {
    local i pid rc j
    for i in $elastic; do
      pid=${proc_pid[$i]:-}
      if [ -n "$pid" ] && [ "${proc_host[$i]}" = localhost ] && stopped "$pid"; then
        [ -n "${frozen_at[$i]:-}" ] || frozen_at[$i]=$SECONDS
        if [ $((SECONDS - frozen_at[$i])) -ge 12 ]; then
          echo "singa-run: job $job_id: process $i (pid $pid) is stopped (frozen) past its ZooKeeper session; killing it, to restart it" >&2
          kill -KILL "$pid" 2>/dev/null || true
        fi
      else
        frozen_at[$i]=""
      fi
      if [ -n "${ended_rc[$i]:-}" ]; then     # remote: reaped by check_ssh alone
        rc=${ended_rc[$i]}; ended_rc[$i]=""
      else
        [ "${proc_host[$i]}" = localhost ] && [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null \
          || continue
        rc=0; wait "$pid" || rc=$?
        forget_pid "$pid"; proc_pid[$i]=""
      fi
      [ $rc -ne 0 ] || continue        # its groups are done
      sleep 1                          # a job stopping as a whole ends its servers too
      for j in "${!proc_pid[@]}"; do
        [[ " $elastic " == *" $j "* ]] || [ -z "${proc_pid[$j]}" ] || kill -0 "${proc_pid[$j]}" 2>/dev/null || rc_whole=$rc
      done
      if [ -n "$rc_whole" ] || [ -n "$snapshot" ]; then
        [ -n "$rc_whole" ] || rc_whole=$rc
        continue
      fi
      if [ $rc -eq 2 ] || [ "${proc_restarts[$i]:-0}" -ge "$max_restarts" ]; then
        echo "singa-run: job $job_id: process $i failed (exit $rc); not restarted: $([ $rc -eq 2 ] && echo "bad input" || echo "max_restarts $max_restarts reached")" >&2
        stop_job "process $i failed"
        exit $rc
      fi
      proc_restarts[$i]=$((${proc_restarts[$i]:-0} + 1))
      echo "singa-run: job $job_id: process $i failed (exit $rc); restart ${proc_restarts[$i]} of $max_restarts: it rejoins the running job" >&2
      echo "process $i restart ${proc_restarts[$i]} of $max_restarts (exit $rc) at $(date +%FT%T)" >>"$log_dir/restarts"
      start_proc "$i" "${proc_host[$i]}" -rejoin
    done
  }
  # A remote process whose ssh session ends is reaped here ($ended_rc, for check_elastic and the
  # job's status). When ssh ends with its own code 255 (the connection, or a remote command
  # killed by a signal) ZooKeeper says how the process ended (done, or stopped: 1; lost, or
  # over: the job has no process left, 255, but 0 for an elastic one: a worker-only process
  # has nothing to rejoin once the processes holding servers are done); one it lists running,
  # or when it does not answer, is detached instead: asked for there every 2 s until it
  # ends (done: 0; stopped or lost: 1), and restarted, or stopped, only then. An elastic one
  # whose ssh runs is asked for every 5 s: lost to ZooKeeper (frozen past its session, or cut
  # off from it) it can never go on, and is stopped over ssh (singa-kill-proc.sh), which ends
  # its session; it is then restarted as a failed one.
  proc_state() { singatool procstate "$job_id" "$1" -confdir "$SINGA_CONF" 2>/dev/null; }
  check_ssh() {
    local i pid rc state
    for i in "${!proc_host[@]}"; do
      [ "${proc_host[$i]}" != localhost ] || continue
      pid=${proc_pid[$i]:-}
      if [ -n "${detached[$i]:-}" ] || { [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }; then
        if [ -n "${detached[$i]:-}" ]; then
          [ $SECONDS -ge "${detached[$i]}" ] || continue
          detached[$i]=$((SECONDS + 2))
        else
          [[ " $elastic " == *" $i "* ]] && [ $SECONDS -ge "${polled[$i]:-0}" ] || continue
          polled[$i]=$((SECONDS + 5))
        fi
        state=$(proc_state "$i") || continue
        case $state in
          running\ *) os_pid[$i]=${state##*|}; continue ;;
          done|over) [ -z "${detached[$i]:-}" ] || { detached[$i]=""; ended_rc[$i]=0; }; continue ;;
        esac
        if [ "$state" = lost ] && [ -n "${os_pid[$i]:-}" ]; then
          echo "singa-run: job $job_id: process $i (pid ${os_pid[$i]} on ${proc_host[$i]}) is $state in ZooKeeper while it runs (frozen, or cut off from ZooKeeper); stopping it" >&2
          singa_ssh -- "${proc_host[$i]}" bash -s -- "$job_id" "${os_pid[$i]}" 0 \
            <"$SINGA_BIN/singa-kill-proc.sh" >/dev/null 2>&1 &
          helpers+=($!); os_pid[$i]=""
        fi
        if [ -n "${detached[$i]:-}" ]; then
          detached[$i]=""; ended_rc[$i]=1
          echo "singa-run: job $job_id: process $i on host ${proc_host[$i]}, detached from its ssh session, ended $state" >&2
        fi
        continue
      fi
      [ -n "$pid" ] || continue
      rc=0; wait "$pid" || rc=$?
      forget_pid "$pid"; proc_pid[$i]=""
      ended_rc[$i]=$rc
      [ $rc -eq 255 ] || continue
      state=$(proc_state "$i") || state=""
      case $state in
        running\ *|"")
          echo "singa-run: job $job_id: host ${proc_host[$i]}: the ssh session of process $i ended (exit 255) while the process runs$([ -n "$state" ] || echo " (or ZooKeeper did not answer)"); watching it in ZooKeeper" >&2
          ended_rc[$i]=""; detached[$i]=$((SECONDS + 2)) ;;
        done) ended_rc[$i]=0 ;;      # it ended normally, and then its session dropped
        stopped) ended_rc[$i]=1 ;;
        over) if [[ " $elastic " == *" $i "* ]]; then     # nothing left to rejoin
                echo "singa-run: job $job_id: host ${proc_host[$i]}: the ssh session of process $i ended (exit 255) as the job ended; its worker groups have nothing left to train" >&2
                ended_rc[$i]=0
              else
                echo "singa-run: job $job_id: host ${proc_host[$i]}: the ssh session of process $i ended (exit 255); ZooKeeper has it $state" >&2
              fi ;;
        *) echo "singa-run: job $job_id: host ${proc_host[$i]}: the ssh session of process $i ended (exit 255); ZooKeeper has it $state" >&2 ;;
      esac
    done
  }
  cmd=("${exe[@]}" "${args[@]}" -singa_conf "$SINGA_CONF/singa.conf" -singa_job "$job_id" -conf "$conf")
  slurm_step=""
  if [ -n "${SLURM_JOB_ID:-}" ]; then
    # inside a Slurm allocation: one srun step, a task per process (Slurm places them: no
    # hostfile), each listening on the address of its node on the route to ZooKeeper
    nprocs=$(singatool nprocs "$conf")
    if [ "${SLURM_NTASKS:-}" != "$nprocs" ]; then
      echo "singa-run: $conf runs $nprocs processes but Slurm job $SLURM_JOB_ID has ${SLURM_NTASKS:-no} tasks (--ntasks=$nprocs; bin/singa-sbatch.sh works it out)" >&2
      exit 2
    fi
    slurm_step="singa-$job_id"
    echo "$SLURM_JOB_ID" >"$log_dir/slurm.job"     # singa-console.sh list shows it beside ours
    echo "Executing : srun --ntasks=$nprocs ${cmd[*]} -host auto"
    srun --ntasks="$nprocs" --job-name="$slurm_step" --kill-on-bad-exit=0 "${cmd[@]}" -host auto &
    local_pids+=($!)
  else
    i=0
    while read -r host _; do
      [ -n "$host" ] || continue
      start_proc "$i" "$host"
      i=$((i + 1))
    done <"$log_dir/job.hosts"
    nprocs=$i
  fi

  sleep 2
  list_pids

  # The job is over when every process has ended, or once ZooKeeper has none of them left
  # (each done or lost): then an ssh to a host that went away is not waited for, nor a local
  # process that is stopped (SIGSTOP: frozen, taken for lost by the others). Only the
  # watcher's exit 0 says so: it rides through a ZooKeeper outage, and when it fails (ZooKeeper
  # unreachable as it starts) another starts 5 s later; it ends with the job.
  start_watcher() {
    "$PYTHON" -m singa.cluster.tool wait "$job_id" -confdir "$SINGA_CONF" >/dev/null 2>&1 &
    watcher=$!; helpers+=("$watcher")
  }
  # True while process $1 is stopped (state T: SIGSTOP, SIGTSTP)
  stopped() {
    local stat
    read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
    stat=${stat##*) }
    [[ $stat == [Tt]* ]]
  }
  # The watcher starts once a process is seen running: one stopped (SIGTERM) as it forks
  # would run this shell's traps in the fork, before its exec
  over=""; closed=(); rewatch=""
  [ -n "$slurm_step" ] || rewatch=0
  while :; do
    [ -n "$over" ] || check_ssh
    [ -z "$elastic" ] || [ -n "$slurm_step" ] || check_elastic
    [ -n "$pids_listed" ] || [ $SECONDS -lt $pids_at ] || list_pids
    alive=0
    for pid in "${local_pids[@]}" "${remote_pids[@]}"; do ! kill -0 "$pid" 2>/dev/null || alive=1; done
    # a process detached from its ssh runs until the job has none left in ZooKeeper
    [ -n "$over" ] || [ -z "${detached[*]// /}" ] || alive=1
    [ $alive -eq 1 ] || break
    if [ -n "$watcher" ] && ! kill -0 "$watcher" 2>/dev/null; then
      rc=0; wait "$watcher" 2>/dev/null || rc=$?
      watcher=""
      if [ $rc -eq 0 ]; then
        over=$SECONDS     # every process has left ZooKeeper: ssh clients get 5 s to end
      else
        rewatch=$((SECONDS + 5))
      fi
    fi
    if [ -n "$rewatch" ] && [ $SECONDS -ge "$rewatch" ]; then
      rewatch=""
      start_watcher
    fi
    if [ -n "$over" ] && [ $((SECONDS - over)) -ge 5 ]; then
      for i in "${!remote_pids[@]}"; do
        if kill -0 "${remote_pids[$i]}" 2>/dev/null; then
          echo "singa-run: host ${remote_hosts[$i]}: its process left job $job_id but its ssh session does not end; closing it" >&2
          kill -TERM "${remote_pids[$i]}" 2>/dev/null || true
          closed[$i]=1
        fi
      done
      for pid in "${local_pids[@]}"; do
        if stopped "$pid"; then
          echo "singa-run: process $pid left job $job_id in ZooKeeper but is stopped (frozen); killing it" >&2
          kill -KILL "$pid" 2>/dev/null || true
        fi
      done
      over=$((SECONDS + 3600))
    fi
    sleep 0.5
  done
  end_helpers
  status=${rc_whole:-0}
  for pid in "${local_pids[@]}"; do
    wait "$pid" || { rc=$?; [ $status -ne 0 ] || status=$rc; }
  done
  # The status of a remote process from its ssh's exit $2 on host $1 ($3: closed here)
  ssh_status() {
    local r=$2
    if [ "$r" -eq 255 ] || [ -n "${3:-}" ]; then
      echo "singa-run: lost host $1: its ssh session ended (exit $r) without its process's status" >&2
      r=1
    fi
    [ $status -ne 0 ] || status=$r
  }
  for i in "${!remote_pids[@]}"; do
    rc=0; wait "${remote_pids[$i]}" || rc=$?
    ssh_status "${remote_hosts[$i]}" $rc "${closed[$i]:-}"
  done
  for i in "${!ended_rc[@]}"; do
    rc=${ended_rc[$i]}
    [ -z "$rc" ] || ssh_status "${proc_host[$i]}" "$rc"
  done
  # done or bad input end here; a process stopped by a signal that was not sent to this
  # launcher (which stop_job handles) is a failure: max_restarts applies
  case $status in 0|2) break ;; esac
  [ -z "$snapshot" ] || break      # stopped after a snapshot, as asked (SIGUSR1)
  # Slurm's SIGUSR1 or SIGTERM to the step (time limit, preemption): the batch script requeues
  [ -z "$slurm_step" ] || case $status in 138|143) break ;; esac
  if [ $restarts -ge "$max_restarts" ]; then
    [ "$max_restarts" -eq 0 ] || echo "singa-run: job $job_id failed (exit $status); not restarted: max_restarts $max_restarts reached" >&2
    break
  fi
  restarts=$((restarts + 1))
  echo "singa-run: job $job_id failed (exit $status); restart $restarts of $max_restarts from its newest complete snapshot" >&2
  args+=(-resume)
done
exit $status
