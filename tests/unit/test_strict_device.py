"""The CuPy stand-in (tests/integration/strict_device.py) takes CuPy 14.2's API only: what
cupy_api/cupy-14.2.json records, as CuPy's `__array_function__` / `__array_ufunc__` would."""
import operator
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import strict_device as sd     # noqa: E402


@pytest.fixture
def a():
    return sd.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))


@pytest.mark.parametrize("call, refusal", [
    (lambda a: np.insert(a, 0, 1), "no cupy.insert"),
    (lambda a: np.linalg.vector_norm(a), "no cupy.linalg.vector_norm"),
    (lambda a: np.sum(a, where=a > 1), "no keyword argument 'where' in cupy.sum"),
    (lambda a: np.sum(a, 0, None, None, False, 0), "no cupy.sum of 6 positional arguments"),
    (lambda a: np.argsort(a, stable=True), "no keyword argument 'stable' in cupy.argsort"),
    (lambda a: np.spacing(a), "no cupy.spacing "),
    (lambda a: np.maximum.reduce(a), "no cupy.maximum.reduce"),
    (lambda a: np.multiply.reduceat(a, [0]), "no cupy.multiply.reduceat"),
    (lambda a: np.add(a, 1, where=a > 1), "no keyword argument 'where' in cupy.add"),
    (lambda a: np.divmod(a, 2, out=(a, a.copy())), "no cupy.divmod call with more than one out array"),
    (lambda a: a.max(initial=0), "no keyword argument 'initial' in cupy.ndarray.max"),
    (lambda a: a.item(0), "no cupy.ndarray.item of 1 positional arguments"),
    (lambda a: a.resize((3, 2)), "no ndarray.resize"),
    (lambda a: a.ctypes, "no ndarray.ctypes"),
    (lambda a: operator.index(a[0, 0].astype(np.int64)), "no ndarray.__index__"),
])
def test_refuses_what_cupy_lacks(a, call, refusal):
    with pytest.raises(sd.StrictError, match="CuPy 14.2 has " + refusal):
        call(a)


def test_a_lacking_attribute_is_absent_as_on_cupy(a):
    assert not hasattr(a, "setflags") and hasattr(a, "ravel")


def test_takes_what_cupy_has(a):
    out = sd.empty_like(a)
    np.maximum(a, 1, out=out)
    np.copyto(out, a, casting="unsafe")
    np.add.reduce(a, axis=0, keepdims=True)
    np.sum(a, axis=1, out=out[:, 0])
    np.einsum("ij,kj->ik", a, a)
    np.linalg.norm(a, axis=1)
    a @ a.T, -a, a ** 2, abs(a), divmod(a, 2)
    # numpy's methods call ufuncs CuPy's do without: maximum.reduce, rint, logical_or.reduce
    a.max(axis=0), a.mean(), a.std(), a.round(), (a > 1).any(), a.clip(0, 1), a.cumsum()
    assert float(a.sum()) == 15
