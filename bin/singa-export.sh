#!/usr/bin/env bash
# Export a job's test net with a snapshot's values (docs/models.md, "Export"):
#
#   singa-export.sh onnx  JOB.conf SNAPSHOT -o OUT.onnx [-batch N]
#   singa-export.sh caffe JOB.conf SNAPSHOT -o OUTDIR   [-batch N]   (deploy.prototxt, model.caffemodel)
#
# SNAPSHOT: a snapshot file, a workspace or checkpoint folder (its newest complete snapshot,
# as -resume finds it), or <checkpoint folder>/step<N>. Bad input: one line, exit 2.
SINGA_HOME=${SINGA_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
export PYTHONPATH="$SINGA_HOME${PYTHONPATH:+:$PYTHONPATH}"
exec "$SINGA_HOME/.venv/bin/python" -m singa.interop.exporter "$@"
