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
# --output, ...). ZooKeeper: the one conf/singa.conf names; a local one (the embedded default)
# serves a job on one node only (singa-run.sh starts it there when it does not answer).
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
ntasks=$("$PYTHON" -c 'import sys; from singa import config, cluster
print(cluster.nprocs(config.load_job(sys.argv[1], check_paths=False, check_layers=False).cluster))' "$conf")
name=$("$PYTHON" -c 'import sys; from singa import config
print(config.load_job(sys.argv[1], check_paths=False, check_layers=False).name)' "$conf")

mkdir -p "$SINGA_LOG/slurm"
batch=$(mktemp "$SINGA_LOG/slurm/singa-batch-XXXXXX.sh")
cat >"$batch" <<EOF
#!/usr/bin/env bash
trap 'asked=1; [ -z "\$run" ] || kill -USR1 "\$run" 2>/dev/null' USR1   # first: a warning may come early
# preemption: the tasks have SIGTERM too and take their snapshot; a user's scancel is no request
trap 'case \$(scontrol show job "\$SLURM_JOB_ID" 2>/dev/null | grep -o "JobState=[A-Z]*") in JobState=CANCELLED) ;; *) asked=1 ;; esac' TERM
asked=""; run=""
# ours: SINGA job '$name' ($ntasks processes), from bin/singa-sbatch.sh
export SINGA_CONF=$(printf %q "$SINGA_CONF") SINGA_LOG=$(printf %q "$SINGA_LOG")
case \$($(printf %q "$PYTHON") -c 'import sys; from singa import config; print(config.load_singa_conf(sys.argv[1]).zookeeper_host)' "\$SINGA_CONF/singa.conf") in
  localhost:*|127.*)
    if [ "\${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then
      echo "singa-sbatch: \$SINGA_CONF/singa.conf names a ZooKeeper on localhost, which the other nodes of job \$SLURM_JOB_ID cannot reach: name one they can" >&2
      exit 2
    fi ;;
esac
flags=()
[ "\${SLURM_RESTART_COUNT:-0}" -eq 0 ] || flags+=(-resume)
$(printf %q "$SINGA_BIN/singa-run.sh") -conf $(printf %q "$conf") "\${flags[@]}" &
run=\$!
while :; do
  rc=0; wait "\$run" || rc=\$?
  kill -0 "\$run" 2>/dev/null || break        # wait returned for a trapped signal: again
done
if [ -n "\$asked" ] && [ "\$rc" -ne 0 ]; then
  echo "singa-sbatch: job stopped after a snapshot (SIGUSR1 before the time limit or a preemption): requeued" >&2
  scontrol requeue "\$SLURM_JOB_ID"
fi
exit \$rc
EOF
chmod +x "$batch"
exec sbatch --requeue --signal="B:USR1@$warn" --ntasks="$ntasks" --job-name="singa-$name" \
  "${opts[@]}" "$batch"
