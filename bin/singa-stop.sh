#!/usr/bin/env bash
# Stop the processes of every job registered in ZooKeeper, then remove all jobs from it.
# (SINGA ran `killall -r singa` on each host of the hostfile; `singa-console.sh kill` signals
# exactly the jobs' own processes, on their hosts, and nothing else whose name has "singa".)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/singa-env.sh"

ids=$(singatool listall -confdir "$SINGA_CONF" | tail -n +3 | cut -d '|' -f 1)
status=0
for id in $ids; do
  "$SINGA_BIN/singa-console.sh" kill "$id" || status=1
done
singatool removeall -confdir "$SINGA_CONF"
exit $status
