#!/usr/bin/env bash
# The whole test suite: installs what it needs (venv, ZooKeeper, Fashion-MNIST), then runs pytest.
# Extra arguments go to pytest (e.g. tests/run.sh tests/unit -x).
set -euo pipefail
SINGA_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$SINGA_HOME/thirdparty/install.sh" --tests
cd "$SINGA_HOME"
exec .venv/bin/python -m pytest -q -rfEs -p no:cacheprovider "$@"
