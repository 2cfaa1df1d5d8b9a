#!/usr/bin/env bash
# Inspect checkpoints without building a net:
#
#   singa-checkpoint.sh ls <workspace|checkpoint folder>
#   singa-checkpoint.sh show <file>
#   singa-checkpoint.sh diff <file a> <file b>      (exit 0 if identical, 1 if not)
#   singa-checkpoint.sh merge <file of a snapshot> <out file|folder> [--axis A]
#       (one file of the snapshot's params, the pieces of partitioned params joined)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/singa-env.sh"
exec "$PYTHON" -m singa.checkpoint "$@"
