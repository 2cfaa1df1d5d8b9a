#!/usr/bin/env bash
# The whole test suite: installs what it needs (venv, ZooKeeper, Fashion-MNIST), then runs pytest.
# Extra arguments go to pytest (e.g. tests/run.sh tests/unit -x). Two pytest workers, each
# test file whole on one (most integration tests wait on timers and other processes: two at
# a time take 22 minutes of 2 cores where one at a time took 37); `-n 0` runs one at a time.
set -euo pipefail
SINGA_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$SINGA_HOME/thirdparty/install.sh" --tests
cd "$SINGA_HOME"
exec .venv/bin/python -m pytest -q -rfEs -p no:cacheprovider -n 2 --dist loadfile "$@"
