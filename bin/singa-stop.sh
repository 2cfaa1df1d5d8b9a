#!/usr/bin/env bash
# Kill the processes of every job registered in ZooKeeper, then remove all jobs from it.
# (SINGA ran `killall -r singa` on each host of the hostfile; the pids that ZooKeeper holds
# kill exactly SINGA's processes and nothing else whose name contains "singa".)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/singa-env.sh"

ids=$($SINGATOOL listall -confdir "$SINGA_CONF" | tail -n +3 | cut -d '|' -f 1)
for id in $ids; do
  "$SINGA_BIN/singa-console.sh" kill "$id"
done
$SINGATOOL removeall -confdir "$SINGA_CONF"
