#!/usr/bin/env bash
# Import a Caffe model as a SINGA job (docs/models.md, "Import"):
#
#   singa-import.sh caffe NET.prototxt [WEIGHTS.caffemodel] [-solver SOLVER.prototxt]
#                   [-solverstate FILE.solverstate] [-input_shape C,H,W] -o DIR
#
# NET may be the solver (its `net`). Writes DIR/job.conf and, with weights or a solver state,
# DIR/checkpoint/step<iter>-worker0.bin (+ .meta); the data layers read DIR/data/*.kvfile,
# which stdout names. A layer or setting without an exact SINGA equivalent: one line, exit 2.
SINGA_HOME=${SINGA_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
PYTHON=${PYTHON:-$SINGA_HOME/.venv/bin/python}
if [ ! -x "$PYTHON" ]; then
  echo "singa: $PYTHON not found; run $SINGA_HOME/thirdparty/install.sh" >&2
  exit 1
fi
export PYTHONPATH="$SINGA_HOME${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m singa.interop.importer "$@"
