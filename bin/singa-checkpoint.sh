#!/usr/bin/env bash
# Inspect checkpoints without building a net:
#
#   singa-checkpoint.sh ls <workspace|checkpoint folder>
#   singa-checkpoint.sh show <file>
#   singa-checkpoint.sh diff <file a> <file b>      (exit 0 if identical, 1 if not)
SINGA_HOME=${SINGA_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
export PYTHONPATH="$SINGA_HOME${PYTHONPATH:+:$PYTHONPATH}"
exec "$SINGA_HOME/.venv/bin/python" -m singa.checkpoint "$@"
