#!/usr/bin/env bash
# Stop all jobs, then delete all of SINGA's data in ZooKeeper (job ids start again from 0).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/singa-env.sh"

"$SINGA_BIN/singa-stop.sh"
singatool cleanup -confdir "$SINGA_CONF"
