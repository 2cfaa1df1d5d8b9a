"""singa.device.footprint: SHAPES sets a net up with the shapes of the real build and no memory; the
one memory rule refuses a param or a layer array beyond this machine's memory."""
import os

import numpy as np
import pytest

import singa
from singa.cluster import launch
from singa.device.footprint import MEMORY_BYTES, SHAPES, BeyondMemory, check_fits
from singa.job import config

CONFS = [os.path.join(singa.HOME, "examples", "mnist", name) for name in ("job.conf", "conv.conf")]


def arrays(net):
    """(owner, name, array) of every array a layer holds, then of every param."""
    out = [(layer.name, k, v) for layer in net.layers for k, v in sorted(vars(layer).items())
           if isinstance(v, np.ndarray)]
    return out + [(p.name, k, getattr(p, k)) for p in net.params for k in ("data", "grad")]


@pytest.mark.parametrize("path", CONFS, ids=os.path.basename)
def test_a_net_on_shapes_has_the_real_builds_arrays_and_its_blobs_and_params_hold_no_memory(path):
    job = config.load_job(path, check_paths=False)
    real, shapes = arrays(launch.build(job)), arrays(launch.build(job, device=SHAPES))
    assert [(o, k, a.shape, a.dtype) for o, k, a in shapes] == \
        [(o, k, a.shape, a.dtype) for o, k, a in real]
    held = [a for o, k, a in shapes if k in ("data", "grad") and a is not None]
    assert len(held) > 10 and all(a.strides == (0,) * a.ndim for a in held)


def test_like_functions_of_a_shapes_array_allocate_nothing():
    a = SHAPES.xp.zeros((10 ** 4, 10 ** 4), np.float32)    # 400 MB claimed
    for b in (np.zeros_like(a), np.empty_like(a, np.int8), np.full_like(a, 3), np.ones_like(a)):
        assert b.shape == a.shape and b.strides == (0, 0)
    assert np.empty_like(a, np.int8).dtype == np.int8


def test_the_rule_refuses_beyond_this_machines_memory_and_no_less():
    check_fits(MEMORY_BYTES, "x needs")
    with pytest.raises(BeyondMemory, match=r"^x needs .*, more than this machine's .* of memory$"):
        check_fits(MEMORY_BYTES + 1, "x needs")
    with pytest.raises(MemoryError, match=r"^an array of shape \(1000000000000, 1000\) "
                                          r"\(float32\) needs 4 PB, more than"):
        SHAPES.xp.empty((10 ** 12, 1000), np.float32)
