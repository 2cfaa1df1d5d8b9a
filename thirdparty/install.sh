#!/usr/bin/env bash
# Install what SINGA needs: Debian's zookeeper (with Java) and dataset-fashion-mnist, and the
# venv $SINGA_HOME/.venv with singa installed in it (editable) with the extras a job uses:
# fast (numba's compiled loops, oneDNN), plot (matplotlib), tensorboard (tensorboardX, the writer).
# --tests adds the test suite's: the extra `test` (pytest, notebooks, TensorBoard's reader,
# ONNX Runtime, ...) and Debian's sshd, iproute2 and Slurm. Either order works: the venv keeps
# every extra installed so far (listed in .venv/.singa-installed) and gets only what it lacks.
# Idempotent: when everything is in place it only checks files.   Usage: install.sh [--quiet] [--tests]
set -euo pipefail

QUIET=
TESTS=
for arg in "$@"; do
  case $arg in
    --quiet) QUIET=1 ;;
    --tests) TESTS=1 ;;     # also what the tests use: sshd, iproute2, Slurm
    *) echo "Usage: install.sh [--quiet] [--tests]" >&2; exit 1 ;;
  esac
done
SINGA_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$SINGA_HOME/.venv
STAMP=$VENV/.singa-installed   # the extras installed; newer than pyproject.toml: current
EXTRAS=fast,plot,tensorboard
[ -z "$TESTS" ] || EXTRAS=$EXTRAS,test
PY=${PYTHON3:-python3}

say() { [ -n "$QUIET" ] || echo "install: $*"; }
die() { echo "install: error: $*" >&2; exit 1; }

# --- Debian packages ---
pkgs=()
{ [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null; } || pkgs+=(zookeeper)
compgen -G "/usr/share/datasets/fashion-mnist/*.gz" >/dev/null || pkgs+=(dataset-fashion-mnist)
[ -z "$TESTS" ] || [ -x /usr/sbin/sshd ] || pkgs+=(openssh-server)
[ -z "$TESTS" ] || command -v ip >/dev/null || pkgs+=(iproute2)    # hosts of network namespaces
if [ -n "$TESTS" ]; then     # a Slurm cluster of the tests' own (tests/integration/test_slurm.py)
  for d in slurmctld slurmd munged srun; do
    command -v "$d" >/dev/null || { pkgs+=(slurmctld slurmd slurm-client munge); break; }
  done
fi
if [ ! -x "$VENV/bin/python" ] && ! "$PY" -c 'import ensurepip' 2>/dev/null; then
  pkgs+=(python3-venv)   # Debian's python3 makes venvs only with this package
fi
if [ ${#pkgs[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing ${pkgs[*]} and no apt-get to install them"
  SUDO=
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "installing ${pkgs[*]} needs root (or sudo)"
    SUDO=sudo
  fi
  say "apt-get update"
  $SUDO apt-get update -qq >/dev/null || die "apt-get update failed"
  say "apt-get install ${pkgs[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null \
    || die "apt-get install ${pkgs[*]} failed"
fi

# --- the venv ---
if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PY" >/dev/null || die "$PY not found; SINGA needs Python 3.11 or newer"
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$PY is Python $("$PY" -c 'import platform; print(platform.python_version())'); SINGA needs 3.11 or newer"
  say "creating the venv $VENV"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" || die "$PY -m venv $VENV failed"
fi
# what is installed: the stamp's extras (an empty stamp is an older install.sh's, which
# installed `test` and with it the others); a reinstall (pyproject.toml changed) keeps them all
have=""
if [ -f "$STAMP" ]; then
  have=$(tr -d ' \n' <"$STAMP")
  [ -n "$have" ] || have=fast,plot,tensorboard,test
  [[ $have =~ ^[a-z]+(,[a-z]+)*$ ]] || have=""
fi
want=$(printf '%s\n' ${have//,/ } ${EXTRAS//,/ } | sort -u | paste -sd, -)
missing=""
for extra in ${EXTRAS//,/ }; do [[ ,$have, == *,$extra,* ]] || missing=1; done
if [ -n "$missing" ] || [ "$SINGA_HOME/pyproject.toml" -nt "$STAMP" ]; then
  say "pip install -e $SINGA_HOME[$want]"
  "$VENV/bin/python" -m pip install ${QUIET:+-q} --disable-pip-version-check -e "$SINGA_HOME[$want]" \
    || die "pip install into $VENV failed"
  echo "$want" >"$STAMP"
fi
say "all installed (venv $VENV, zookeeper, dataset-fashion-mnist)"
