#!/usr/bin/env bash
# Export a job's test net with a snapshot's values (docs/models.md, "Export"):
#
#   singa-export.sh onnx  JOB.conf SNAPSHOT -o OUT.onnx [-batch N]
#   singa-export.sh caffe JOB.conf SNAPSHOT -o OUTDIR   [-batch N]   (deploy.prototxt, model.caffemodel)
#
# SNAPSHOT: a snapshot file, a workspace or checkpoint folder (its newest complete snapshot,
# as -resume finds it), or <checkpoint folder>/step<N>. Bad input: one line, exit 2.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/singa-env.sh"
exec "$PYTHON" -m singa.interop.exporter "$@"
