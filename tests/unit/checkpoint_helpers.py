"""What the checkpoint tests share: SINGA's fixture files, params, states and snapshots made here,
the CLI."""
import os
import subprocess
import sys

import numpy as np

import singa
from singa import checkpoint as ckpt
from singa.net.numerics import rng_state

FIX = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "singa-0.3"))


FIX_NAMES = ["0#weight1", "0#bias1", "0#weight2", "0#bias2"]


FIX_SHAPES = [(64, 784), (64,), (10, 64), (10,)]

# SINGA's layout: two params, versions 100, as SINGA (and python protobuf) serialize them.


EXAMPLE = bytes.fromhex(
    "18 64 18 64  22 04 30 23 77 31  22 04 30 23 62 31"
    "2a 1e 08 02 08 03 12 18 cdcccc3d cdcc4c3e 9a99993e cdcccc3e 0000003f 9a99193f"
    "2a 0c 08 02 12 08 0000803f 000080bf")


EXAMPLE_PARAMS = [("0#w1", np.array([[.1, .2, .3], [.4, .5, .6]], np.float32), 100),
                  ("0#b1", np.array([1, -1], np.float32), 100)]


def params(seed=0, version=7):
    rng = np.random.default_rng(seed)
    return [("0#w1", rng.standard_normal((4, 3)).astype(np.float32), version),
            ("0#b1", rng.standard_normal(4).astype(np.float32), version)]


def state(step=5, nworkers=1, **kw):
    rng = np.random.default_rng(42)
    rng.standard_normal(3)
    return ckpt.SnapshotState(
        step=step, nworkers=nworkers, lr_index=2,
        param_state={"0#w1": [np.full((4, 3), 0.5, np.float32)]},
        rng={"worker0": rng_state(rng)}, reader={"data": (1234, True)}, **kw)


def snapshot(folder, step, nworkers=1, metrics=None, workers=None):
    """Files of workers 0..nworkers-1 (or `workers`); worker 0 holds the params and their
    updater state, as in a data-parallel run."""
    for w in (range(nworkers) if workers is None else workers):
        st = state(step, nworkers, metrics=dict(metrics or {}))
        if w:
            st.param_state = {}
        ckpt.write_file(ckpt.snapshot_file(folder, step, w), params(step) if w == 0 else [], st)


def values_and_versions(reader):
    """{name: (values, version)} of every param of a CheckpointReader's file."""
    return {n: (reader.param(n), reader.version(n)) for n in reader.names}


def cli(*args):
    return subprocess.run([sys.executable, "-m", "singa.checkpoint", *args], cwd=singa.HOME,
                          capture_output=True, text=True, timeout=60)


def paths(entries, workspace, **kw):
    return [r.path for r in ckpt.open_checkpoint_path(entries, workspace, **kw)]
