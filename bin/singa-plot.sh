#!/usr/bin/env bash
# Draw a workspace's training curves (its metrics.csv) as a PNG:
#
#   singa-plot.sh <workspace> [-o curves.png] [-job ID]
#
# needs matplotlib (pip install 'singa[plot]'; the test extras have it).
SINGA_HOME=${SINGA_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
export PYTHONPATH="$SINGA_HOME${PYTHONPATH:+:$PYTHONPATH}"
exec "$SINGA_HOME/.venv/bin/python" -m singa.plot "$@"
