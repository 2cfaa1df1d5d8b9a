#!/usr/bin/env bash
# Submit a SINGA job to Slurm:
#
#   singa-sbatch.sh -conf <job.conf> [-warn SECONDS] [sbatch options...]
#
# Works out the job's processes from the conf (--ntasks), and submits a batch job that runs
# bin/singa-run.sh -conf <job.conf> inside the allocation (one srun step, a task per process)
# with --requeue and --signal=B:USR1@SECONDS (default 120): before the time limit the batch
# script gets SIGUSR1, the job writes a snapshot a step or two later and stops, the batch job
# requeues itself, and the next run (SLURM_RESTART_COUNT > 0) passes -resume. Preemption
# (SIGTERM to the tasks within the grace time) takes a snapshot the same way. `scancel` is not
# requeued. Prints sbatch's "Submitted batch job <id>". Other options go to sbatch (-p, -t, -N,
# --ntasks-per-node=1 for a process per node, --output, ...). ZooKeeper: the one
# conf/singa.conf names; when that is a local one (the embedded default), singa-run.sh starts
# it on a job's one node, and for a job on several nodes the batch script runs one of the
# job's own on the first node's address for the job's lifetime (docs/slurm.md).
set -euo pipefail
SINGA_BIN=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SINGA_HOME=$(dirname "$SINGA_BIN")

usage() { echo "Usage: singa-sbatch.sh -conf <job.conf> [-warn SECONDS] [sbatch options...]" >&2; exit 2; }

conf=""; warn=120; opts=()
while [ $# -gt 0 ]; do
  case $1 in
    -conf) [ $# -ge 2 ] || usage; conf=$2; shift 2 ;;
    -warn) [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]] || usage; warn=$2; shift 2 ;;
    -h|--help) usage ;;
    *) opts+=("$1"); shift ;;
  esac
done
[ -n "$conf" ] || usage
[ -f "$conf" ] || { echo "singa-sbatch: $conf not exists" >&2; exit 2; }
conf=$(cd "$(dirname "$conf")" && pwd)/$(basename "$conf")
command -v sbatch >/dev/null || { echo "singa-sbatch: sbatch not found: is this a Slurm cluster?" >&2; exit 2; }

"$SINGA_HOME/thirdparty/install.sh" --quiet
. "$SINGA_BIN/singa-env.sh"
# the whole conf, once, before anything is submitted (a mistake: one line, exit 2)
"$PYTHON" -m singa.driver -check -singa_conf "$SINGA_CONF/singa.conf" -conf "$conf" -oversubscribe
ntasks=$(singatool nprocs "$conf")
name=$(singatool jobname "$conf")

mkdir -p "$SINGA_LOG/slurm"
batch=$(mktemp "$SINGA_LOG/slurm/singa-batch-XXXXXX.sh")
cat >"$batch" <<EOF
#!/usr/bin/env bash
trap 'asked=\${asked:-\$(date +%T.%6N)}' USR1   # first: a warning may come early (the loop passes it on)
trap 'true' TERM      # a user's scancel or a preemption: the tasks have it too and stop
asked=""; run=""; passed=""
# ours: SINGA job '$name' ($ntasks processes), from bin/singa-sbatch.sh
export SINGA_CONF=$(printf %q "$SINGA_CONF") SINGA_LOG=$(printf %q "$SINGA_LOG")
singatool() { $(printf %q "$PYTHON") -m singa.cluster.tool "\$@"; }
# ZooKeeper: the one singa.conf names; a local one (the embedded default) serves a job on one
# node, and on several a ZooKeeper of the job's own runs here, on the first node's address
# (Slurm's NodeAddr), for the job's lifetime: the job's singa.conf names it
zk_data=""; conf_dir=""
stop_zk() {
  [ -n "\$zk_data" ] || return 0
  ZK_DATA="\$zk_data" SINGA_MANAGES_ZK=true $(printf %q "$SINGA_BIN/zk-service.sh") stop >/dev/null 2>&1 || true
  rm -rf "\$zk_data" "\$conf_dir"; zk_data=""
}
trap stop_zk EXIT
case \$(singatool getzkhost -confdir "\$SINGA_CONF") in
  localhost:*|127.*)
    if [ "\${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then
      addr=\$(scontrol show node "\$SLURMD_NODENAME" | grep -o "NodeAddr=[^ ]*") && addr=\${addr#NodeAddr=}
      [ -n "\$addr" ] || { echo "singa-sbatch: no NodeAddr of node \$SLURMD_NODENAME in scontrol show node" >&2; exit 1; }
      port=\$(singatool freeport "\$addr")
      zk_data=\$(mktemp -d "\${TMPDIR:-/tmp}/singa-zk-\$SLURM_JOB_ID-XXXXXX")
      ZK_DATA="\$zk_data" ZK_ADDRESS="\$addr" ZK_PORT="\$port" SINGA_MANAGES_ZK=true \\
        $(printf %q "$SINGA_BIN/zk-service.sh") start >&2 || exit 1
      conf_dir=\$SINGA_LOG/slurm/conf-\$SLURM_JOB_ID
      mkdir -p "\$conf_dir"
      [ ! -f "\$SINGA_CONF/hostfile" ] || cp "\$SINGA_CONF/hostfile" "\$conf_dir/"
      singatool withzkhost "\$addr:\$port" -confdir "\$SINGA_CONF" >"\$conf_dir/singa.conf"
      echo "singa-sbatch: ZooKeeper of Slurm job \$SLURM_JOB_ID on \$addr:\$port (\$conf_dir/singa.conf)" >&2
      export SINGA_CONF=\$conf_dir
    fi ;;
esac
flags=()
[ "\${SLURM_RESTART_COUNT:-0}" -eq 0 ] || flags+=(-resume)
$(printf %q "$SINGA_BIN/singa-run.sh") -conf $(printf %q "$conf") "\${flags[@]}" &
run=\$!
while :; do
  if [ -n "\$asked" ] && [ -z "\$passed" ]; then
    # SIGUSR1 to singa-run.sh once it has started srun (its trap is set; before, it would die)
    while kill -0 "\$run" 2>/dev/null && ! pgrep -P "\$run" -x srun >/dev/null; do
      sleep 0.2
    done
    echo "singa-sbatch: SIGUSR1 at \$asked (the time limit is near, or by hand): the job snapshots and stops" >&2
    kill -USR1 "\$run" 2>/dev/null || true; passed=1
  fi
  rc=0; wait "\$run" || rc=\$?
  kill -0 "\$run" 2>/dev/null || break        # wait returned for a trapped signal: again
done
# stopped after a snapshot: SIGUSR1 here before the time limit, or the tasks' SIGTERM of a
# preemption (its grace time; the batch script is not told, and a job that ends within its
# grace is marked completed, not requeued): requeue while the job is RUNNING; after a user's
# scancel it is COMPLETING (and CANCELLED): not requeued
if [ "\$rc" -ne 0 ] && { [ -n "\$asked" ] || [ "\$rc" -eq 138 ] || [ "\$rc" -eq 143 ]; } &&
   scontrol show job "\$SLURM_JOB_ID" 2>/dev/null | grep -q "JobState=RUNNING"; then
  echo "singa-sbatch: job stopped after a snapshot (SIGUSR1 before the time limit or a preemption): requeued" >&2
  stop_zk
  scontrol requeue "\$SLURM_JOB_ID"
fi
exit \$rc
EOF
chmod +x "$batch"
exec sbatch --requeue --signal="B:USR1@$warn" --ntasks="$ntasks" --job-name="singa-$name" \
  "${opts[@]}" "$batch"
