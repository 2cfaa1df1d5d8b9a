#!/usr/bin/env bash
# rnnlm (SINGA 0.3's examples/rnnlm): make the word shards from the license texts, then train
# SINGA's job.conf with the example's own layers and proto, as SINGA ran rnnlm.bin with -exec.
# Extra args go to singa-run.sh.
set -euo pipefail
SINGA_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$SINGA_HOME/examples/rnnlm
"$SINGA_HOME/thirdparty/install.sh"
"$SINGA_HOME/.venv/bin/python" "$HERE/create_data.py"
exec "$SINGA_HOME/bin/singa-run.sh" -conf "$HERE/job.conf" \
  -user_proto "$HERE/rnnlm.proto" -user_layers "$HERE/rnnlm.py" "$@"
