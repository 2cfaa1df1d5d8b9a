#!/usr/bin/env bash
# Draw a workspace's training curves (its metrics.csv) as a PNG:
#
#   singa-plot.sh <workspace> [-o curves.png] [-job ID | -all]
#
# By default the newest run with the runs it resumed; -job ID one job's rows; -all every row.
# needs matplotlib (pip install 'singa[plot]'; the test extras have it).
SINGA_HOME=${SINGA_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
PYTHON=${PYTHON:-$SINGA_HOME/.venv/bin/python}
if [ ! -x "$PYTHON" ]; then
  echo "singa: $PYTHON not found; run $SINGA_HOME/thirdparty/install.sh" >&2
  exit 1
fi
export PYTHONPATH="$SINGA_HOME${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m singa.plot "$@"
