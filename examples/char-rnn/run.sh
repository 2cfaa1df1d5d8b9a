#!/usr/bin/env bash
# char-rnn (SINGA 0.3's examples/char-rnn): make input.txt and vocab.txt from GPL-3, train a GRU
# language model on its characters with kBPTT (job.conf: 2000 steps, the step2000 snapshot),
# then print 100 characters it generates (sample.conf, -test). Extra args go to singa-run.sh.
set -euo pipefail
SINGA_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
"$SINGA_HOME/thirdparty/install.sh"
"$SINGA_HOME/.venv/bin/python" "$SINGA_HOME/examples/char-rnn/create_data.py"
"$SINGA_HOME/bin/singa-run.sh" -conf "$SINGA_HOME/examples/char-rnn/job.conf" "$@"
"$SINGA_HOME/bin/singa-run.sh" -conf "$SINGA_HOME/examples/char-rnn/sample.conf" -test "$@"
echo
