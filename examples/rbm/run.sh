#!/usr/bin/env bash
# Stacked RBMs, then the deep auto-encoder they initialise (SINGA 0.3's examples/rbm): make the
# Fashion-MNIST kvfile shards if they are absent, train rbm1..rbm4 with contrastive divergence
# (each loads the levels below from the previous workspaces' step6000 snapshots), then fine-tune
# autoencoder.conf with back-propagation. Extra args go to every singa-run.sh.
set -euo pipefail
SINGA_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
"$SINGA_HOME/thirdparty/install.sh"
"$SINGA_HOME/.venv/bin/python" "$SINGA_HOME/examples/mnist/create_data.py"
for job in rbm1 rbm2 rbm3 rbm4 autoencoder; do
  "$SINGA_HOME/bin/singa-run.sh" -conf "$SINGA_HOME/examples/rbm/$job.conf" "$@"
done
