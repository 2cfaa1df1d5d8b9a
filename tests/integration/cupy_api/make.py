"""Write cupy-<version>.json: the part of numpy's API that CuPy takes over, as
cupy/_core/core.pyx's `ndarray.__array_function__` and `__array_ufunc__` do it. Run it with
CuPy and the numpy that singa uses installed (no GPU needed): python make.py

A signature is recorded without its defaults ("(a, axis, *, keepdims)"), or null where CuPy's
(Cython) function has none to read.
"""
import functools
import importlib
import inspect
import json
import os
import pkgutil
import re

import cupy
import cupyx.scipy.special
import numpy as np
from numpy.testing.overrides import get_overridable_numpy_array_functions

#: what cupy's ufunc.__call__ takes besides the arrays (cupy/_core/_kernel.pyx; its `_where`
#: is private), checked below
UFUNC_CALL = "(*args, out, dtype, casting)"
UFUNC_METHODS = ("reduce", "accumulate", "reduceat", "outer", "at")


def signature(f):
    """f's parameters without defaults, or None where they cannot be read."""
    if isinstance(f, cupy.ufunc):
        return UFUNC_CALL
    try:
        sig = inspect.signature(f)
    except (TypeError, ValueError):
        return None
    return str(sig.replace(parameters=[p.replace(default=p.empty, annotation=p.empty)
                                       for p in sig.parameters.values()],
                           return_annotation=sig.empty))


def method_signature(name):
    """The parameters after self of cupy.ndarray's method `name`, from the signature Cython
    writes atop its docstring ("_ndarray_base.sum(self, axis=None, ...)"), or None."""
    doc = getattr(cupy.ndarray, name).__doc__ or ""
    m = re.match(rf"[\w.]*\.{name}\(self(?:, )?(.*)\)( -> \w+)?$", doc.partition("\n")[0])
    if not m:
        return None
    params = [p.partition("=")[0].split()[-1] for p in m[1].split(", ") if p]
    if not all(re.fullmatch(r"\*{0,2}\w+", p) for p in params):
        return None
    return f"({', '.join(params)})"


def ndarray():
    """cupy.ndarray's names (public ones and dunders) -> a method's signature, or None."""
    return {n: method_signature(n) if callable(getattr(cupy.ndarray, n)) else None
            for n in dir(cupy.ndarray) if not n.startswith("_") or n.startswith("__")}


def numpy_functions():
    """numpy's overridable functions, with every public submodule imported (numpy 2 loads
    some lazily, and a function registers as overridable when its module is imported)."""
    for m in pkgutil.walk_packages(np.__path__, "numpy."):
        parts = m.name.split(".")
        if not any(p.startswith("_") or p in ("tests", "f2py", "distutils", "typing",
                                              "conftest") for p in parts):
            try:
                importlib.import_module(m.name)
            except ImportError:
                pass
    return get_overridable_numpy_array_functions()


def functions():
    """'module.name' of each numpy function CuPy implements -> the signature of CuPy's."""
    found = {}
    for func in numpy_functions():
        try:
            module = functools.reduce(getattr, func.__module__.split(".")[1:], cupy)
            cupy_func = getattr(module, func.__name__)
        except AttributeError:
            continue
        if cupy_func is not func:
            found[f"{func.__module__}.{func.__name__}"] = signature(cupy_func)
    return found


class _Called(Exception):
    pass


class _Probe:
    """An array for cupy's ufunc methods: they call one of these where they support the
    ufunc (add.reduce calls array.sum) and raise NotImplementedError where not."""

    def __getattr__(self, name):
        raise _Called(name)


def supports(cupy_ufunc, method):
    """Whether `cupy_ufunc.method` computes (rather than raising NotImplementedError)."""
    if method == "outer":       # any ufunc: it reshapes and calls the ufunc
        return True
    try:
        getattr(cupy_ufunc, method)(_Probe(), None)
    except _Called:
        return True
    except NotImplementedError:
        return False
    raise AssertionError(f"{cupy_ufunc.name}.{method}: neither computed nor refused")


def ufuncs():
    """numpy's ufunc name -> {method: signature of CuPy's (its parameters after the arrays
    for a method other than __call__)} for the methods CuPy's counterpart supports."""
    names = {u.__name__ for u in vars(np).values() if isinstance(u, np.ufunc)}
    found = {}
    for name in sorted(names):
        func = getattr(cupy, name, None) or getattr(cupyx.scipy.special, name, None)
        if func is None:
            continue
        methods = {"__call__": signature(func)}
        for method in UFUNC_METHODS:
            if isinstance(func, cupy.ufunc) and supports(func, method) or \
                    not isinstance(func, cupy.ufunc) and hasattr(func, method):
                methods[method] = signature(getattr(func, method))
        found[name] = methods
    return found


def check_ufunc_call():
    """UFUNC_CALL's keywords are those cupy's ufunc takes (a wrong one: 'Wrong arguments')."""
    for word in ("out", "dtype", "casting", "where", "subok", "order", "axes", "signature"):
        try:
            cupy.add(**{word: None})
        except TypeError as e:
            taken = "Wrong arguments" not in str(e)
        assert taken == (word in UFUNC_CALL), word


def main():
    check_ufunc_call()
    data = {"cupy": cupy.__version__, "numpy": np.__version__,
            "functions": functions(), "ufuncs": ufuncs(),
            "ndarray": ndarray()}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        f"cupy-{cupy.__version__.rpartition('.')[0]}.json")
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{path}: {len(data['functions'])} functions, {len(data['ufuncs'])} ufuncs, "
          f"{len(data['ndarray'])} ndarray names")


if __name__ == "__main__":
    main()
