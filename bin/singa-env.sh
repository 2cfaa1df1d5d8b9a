# Environment of SINGA's scripts (source it). Sets, unless already set: SINGA_BIN, SINGA_HOME,
# SINGA_CONF, PYTHON (the venv of thirdparty/install.sh), SINGA_LOG (log_dir of singa.conf, no
# trailing /), SINGA_MANAGES_ZK (true: bin/zk-service.sh runs a local server); defines
# `singatool` (python -m singa.cluster.tool), `singa_ssh` and `SINGA_SSH` (ssh as the scripts use it)
# and `valid_host` (a host name safe to give ssh).
if [ -z "${SINGA_ENV_DONE:-}" ]; then
  : "${SINGA_BIN:=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
  : "${SINGA_HOME:=$(dirname "$SINGA_BIN")}"
  : "${SINGA_CONF:=$SINGA_HOME/conf}"
  : "${PYTHON:=$SINGA_HOME/.venv/bin/python}"
  : "${SINGA_MANAGES_ZK:=true}"
  if [ ! -x "$PYTHON" ]; then
    echo "singa: $PYTHON not found; run $SINGA_HOME/thirdparty/install.sh" >&2
    return 1 2>/dev/null || exit 1
  fi
  # the package imports from SINGA_HOME even where it is not pip-installed
  export PYTHONPATH="$SINGA_HOME${PYTHONPATH:+:$PYTHONPATH}"
fi

singatool() { "$PYTHON" -m singa.cluster.tool "$@"; }

# ssh to a host of a job, the one definition every script uses (launch, kill, snapshot): no
# prompts, a bounded connect, keep-alives (a host that stops answering ends its ssh within
# 15 s), no host keys kept. SINGA_SSH_OPTS, extra options (e.g. "-i key -p 2222"), come first:
# ssh takes the first value of an option, so they may change these. "${SINGA_SSH[@]}" is the
# same command for a script that starts it with & and keeps its pid: a function started with &
# runs in a subshell, whose pid is not ssh's, and a kill of it leaves ssh running.
# shellcheck disable=SC2206
SINGA_SSH=(ssh ${SINGA_SSH_OPTS:-} -oBatchMode=yes -oConnectTimeout=10 -oServerAliveInterval=5
           -oServerAliveCountMax=3 -oStrictHostKeyChecking=no -oUserKnownHostsFile=/dev/null
           -oLogLevel=quiet)
singa_ssh() { "${SINGA_SSH[@]}" "$@"; }

# True when $1 is a host name or IPv4 address: letters, digits, '.', '-', '_', not starting
# with '-' (which ssh would take for an option).
valid_host() { [[ ${#1} -le 253 && $1 =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]]; }

if [ -z "${SINGA_ENV_DONE:-}" ]; then
  if [ -z "${SINGA_LOG:-}" ]; then
    SINGA_LOG=$(singatool getlogdir -confdir "$SINGA_CONF") || { return 2 2>/dev/null || exit 2; }
  fi
  export SINGA_BIN SINGA_HOME SINGA_CONF PYTHON SINGA_LOG SINGA_MANAGES_ZK
  export SINGA_ENV_DONE=1
fi
