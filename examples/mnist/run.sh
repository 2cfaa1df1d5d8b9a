#!/usr/bin/env bash
# Quick start: install what is missing, turn Fashion-MNIST (IDX) into SINGA kvfile shards if they
# are absent, and train SINGA's MNIST MLP (examples/mnist/job.conf). Extra args go to singa-run.sh.
set -euo pipefail
SINGA_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
"$SINGA_HOME/thirdparty/install.sh"
"$SINGA_HOME/.venv/bin/python" "$SINGA_HOME/examples/mnist/create_data.py"
exec "$SINGA_HOME/bin/singa-run.sh" -conf "$SINGA_HOME/examples/mnist/job.conf" "$@"
