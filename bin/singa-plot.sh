#!/usr/bin/env bash
# Draw a workspace's training curves (its metrics.csv) as a PNG:
#
#   singa-plot.sh <workspace> [-o curves.png] [-job ID | -all]
#
# By default the newest run with the runs it resumed; -job ID one job's rows; -all every row.
# needs matplotlib (pip install 'singa[plot]'; the test extras have it).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/singa-env.sh"
exec "$PYTHON" -m singa.watch.plot "$@"
