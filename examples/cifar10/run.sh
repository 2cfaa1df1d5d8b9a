#!/usr/bin/env bash
# Quick start: install what is missing, make examples/cifar10's shards and train SINGA's
# examples/cifar10/job.conf. Extra args go to singa-run.sh.
# The data is CIFAR-10 when its binary batches are in examples/cifar10/cifar-10-batches-bin;
# otherwise it is Fashion-MNIST packed into CIFAR-10's layout (padded to 32x32, grey replicated
# to R, G, B), which is NOT CIFAR-10.
set -euo pipefail
SINGA_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$SINGA_HOME/examples/cifar10
PYTHON=$SINGA_HOME/.venv/bin/python
"$SINGA_HOME/thirdparty/install.sh"
SOURCE=$HERE/cifar-10-batches-bin
if [ ! -d "$SOURCE" ]; then
  SOURCE=$HERE/fashion-mnist-as-cifar-bin
  echo "no CIFAR-10 in $HERE/cifar-10-batches-bin: using Fashion-MNIST packed into CIFAR-10's layout (not CIFAR-10)" >&2
  [ -f "$SOURCE/test_batch.bin" ] || "$PYTHON" "$HERE/fashion_to_cifar.py" --out-dir "$SOURCE"
fi
"$PYTHON" "$HERE/create_data.py" "$SOURCE" "$HERE"
exec "$SINGA_HOME/bin/singa-run.sh" -conf "$HERE/job.conf" "$@"
