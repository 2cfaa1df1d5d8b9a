#!/usr/bin/env bash
# Import a Caffe model as a SINGA job (docs/models.md, "Import"):
#
#   singa-import.sh caffe NET.prototxt [WEIGHTS.caffemodel] [-solver SOLVER.prototxt]
#                   [-solverstate FILE.solverstate] [-input_shape C,H,W] -o DIR
#
# NET may be the solver (its `net`). Writes DIR/job.conf and, with weights or a solver state,
# DIR/checkpoint/step<iter>-worker0.bin (+ .meta); the data layers read DIR/data/*.kvfile,
# which stdout names. A layer or setting without an exact SINGA equivalent: one line, exit 2.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/singa-env.sh"
exec "$PYTHON" -m singa.interop.caffe.importer "$@"
