"""A stand-in for CuPy that runs on the CPU and is stricter than CuPy about what a GPU cannot
do, so that the CPU tests find the code that would break on a GPU: an operation mixing a host
array (numpy's) with a device array, a host array as an index or as an assigned value, a
device array handed to the buffer protocol (`bytes`, ZeroMQ), atomic adds (`ufunc.at`),
float64 creeping into device arrays. Device arrays are `DevArray`s; host <-> device only
through `asarray`, `DevArray.get` and `DevArray.set`, as with CuPy. It counts the bytes that
cross (`moved`) and the host's waits for the GPU (`waits`): a device value read on the host
(`get`, `float`, `int`, `bool`, `item`) and a copy to the device from pageable memory; a copy
from pinned memory (`cuda.alloc_pinned_memory`) on a stream does not wait.

It takes only the API that CuPy 14.2 has (cupy_api/cupy-14.2.json): a numpy function, ufunc,
ufunc method or argument that CuPy's `__array_function__` / `__array_ufunc__` would not take
is refused, and so are a name of numpy's ndarray that cupy.ndarray lacks (an AttributeError
too, as there) and an argument that cupy.ndarray's method would not take.

Stream capture (`Stream.begin_capture` ... `end_capture`, `Graph.launch`) is a GPU's: what
is queued while capturing is recorded, not computed (the device memory it wrote is as before
the capture, what it made holds garbage), a host read or a pageable copy is refused, and a
launch replays the recorded operations on the arrays as they are then.

Devices: `installed(monkeypatch, gpus=N)` makes `singa.device` use this module as cupy, with N
visible GPUs (1 by default). A device array lies on the device that was the thread's current
one when it was made (a view on its base's); an operation on arrays of a device other than the
thread's current one is refused (CuPy would read another GPU's memory through peer access, or
fail where the GPUs have none): values cross between devices only by
`MemoryPointer.copy_from_device_async`, counted in `moved["between devices"]`.

It checks the discipline only: numbers are numpy's, so a GPU's own rounding is tests/gpu's.
"""
import ast
import collections
import contextlib
import functools
import inspect
import json
import os
import sys
import threading
import types

import numpy as np

float32, float64, int32, int64, intp, uint8 = (np.float32, np.float64, np.int32, np.int64,
                                               np.intp, np.uint8)


class StrictError(TypeError):
    """What CuPy would refuse (or a GPU would compute in a varying order)."""


class Lacking(StrictError, AttributeError):
    """A name of numpy's ndarray that cupy.ndarray lacks."""


CUPY = "CuPy 14.2"
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cupy_api",
                       "cupy-14.2.json")) as _f:
    API = json.load(_f)


@functools.lru_cache(maxsize=None)
def _takes(signature):
    """(the most positional arguments, the keyword names) a signature string takes (None:
    any), None for any call."""
    if signature is None:
        return None
    a = ast.parse(f"def f{signature}: pass").body[0].args
    return (None if a.vararg else len(a.posonlyargs + a.args),
            None if a.kwarg else {p.arg for p in a.args + a.kwonlyargs})


def _unfit(takes, nargs, words):
    """What CuPy's function that `takes` (`_takes`) would not take of a call with `nargs`
    positional arguments and keywords `words` (its name to format in), or None."""
    if takes is None:
        return None
    most, names = takes
    if most is not None and nargs > most:
        return f"{{}} of {nargs} positional arguments (at most {most})"
    for word in words:
        if names is not None and word not in names:
            return f"keyword argument {word!r} in {{}}"
    return None


_ABSENT = "{} (numpy's function on a device array)"


@functools.lru_cache(maxsize=None)
def _function_takes(func):
    signature = API["functions"].get(f"{func.__module__}.{func.__name__}", _ABSENT)
    return _ABSENT if signature is _ABSENT else _takes(signature)


def _check_function(func, args, kwargs):
    """Refuse numpy's `func`(*args, **kwargs) on device arrays where CuPy would."""
    takes = _function_takes(func)
    why = _ABSENT if takes is _ABSENT else _unfit(takes, len(args), kwargs)
    if why:
        call = f"{func.__module__}.{func.__name__}"
        raise StrictError(f"{call}: {CUPY} has no " + why.format("cupy" + call[5:]))


class _Depth(threading.local):
    value = 0


#: a thread's depth in numpy's own ndarray methods, whose ufuncs are numpy's business
_in_numpy = _Depth()


def _check_ufunc(ufunc, method, out, kwargs):
    """Refuse `ufunc.method` with `out` and `kwargs` on device arrays where CuPy would."""
    if _in_numpy.value:
        return
    methods = API["ufuncs"].get(ufunc.__name__, {})
    if method not in methods:
        why = "{} (numpy's ufunc on a device array)"
    elif out is not None and len(out) > 1:
        why = "{} call with more than one out array"
    else:
        why = _unfit(_takes(methods[method]), 0, kwargs if out is None else [*kwargs, "out"])
    if why:
        call = f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        raise StrictError(f"{call}: {CUPY} has no " + why.format("cupy" + call[5:]))


def _check(values, what):
    for v in values:
        if isinstance(v, (list, tuple)):
            _check(v, what)
        elif type(v) is np.ndarray:
            raise StrictError(f"{what}: a host array of shape {v.shape} mixed with device arrays")
        elif isinstance(v, DevArray):
            _check_here(v, what)


def _check_here(a, what):
    """Refuse device array `a` where the calling thread's current device is another."""
    here = _Device.now()
    if a._gpu != here:
        raise StrictError(f"{what}: an array of GPU {a._gpu} used on GPU {here} (copy it across "
                          f"first: another device's memory)")


def _plain(v):
    if isinstance(v, DevArray):
        return v.view(np.ndarray)
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    return v


def _dev(v):
    """Results on the device: arrays, and scalars as 0-d arrays (CuPy's reductions)."""
    if type(v) is np.ndarray:
        return v.view(DevArray)
    if isinstance(v, np.generic):
        return np.asarray(v).view(DevArray)
    if isinstance(v, tuple):
        return tuple(_dev(x) for x in v)
    if isinstance(v, list):
        return [_dev(x) for x in v]
    return v


#: bytes copied between host and device, each way
moved = collections.Counter()
#: the host's waits for the GPU, by kind: "read" (a device value on the host), "pageable copy"
waits = collections.Counter()
#: device operations queued so far (ufuncs, array functions, assignments, kernels, copies)
queued = [0]
#: for each wait for an event (`Event.synchronize`): the operations queued after its record,
#: which a GPU might not have reached yet (0: the host waited for all it had queued)
event_waits = []


class _Capture:
    """What a stream records while capturing: the operations to replay, the device memory they
    wrote with its contents before (restored at the end), the arrays they made (garbage)."""

    def __init__(self, stream):
        self.stream = stream
        self.ops, self.saved, self.made = [], {}, []

    def snapshot(self, arrays):
        """Copies of the memory of `arrays` not saved yet (what an operation may write)."""
        roots = {id(r): r for r in map(_root, arrays) if id(r) not in self.saved}
        return [(key, root, root.copy()) for key, root in roots.items()]

    def keep_written(self, before):
        """Save the memory of `before` (a snapshot) that the operation since has changed."""
        for key, root, copy in before:
            if not np.array_equal(root, copy, equal_nan=root.dtype.kind in "fc"):
                self.saved[key] = (root, copy)

    def end(self):
        for root, before in self.saved.values():
            np.copyto(root, before)
        for a in self.made:
            plain = a.view(np.ndarray)
            plain[...] = np.nan if plain.dtype.kind == "f" else 0x5A
        return Graph(self.ops)


_captures = {}      # thread id -> the capture it has under way


def _capturing():
    """The capture recording what this thread queues now, or None."""
    cap = _captures.get(threading.get_ident())
    return cap if cap is not None and get_current_stream() is cap.stream else None


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.view(np.ndarray) if isinstance(a, DevArray) else a


def _run(call, writes=(), inputs=None):
    """Queue an operation: `call()` now. While this thread's stream captures, it is recorded
    for replays and the memory it wrote (among `writes`) is restored when the capture ends;
    with `inputs`, the operation makes its result, which a replay writes again, and which
    holds garbage after the capture unless it views an input's memory."""
    queued[0] += 1
    cap = _capturing()
    if cap is None:
        return call()
    before = cap.snapshot(writes)
    result = call()
    if isinstance(result, np.generic):      # CuPy's is a 0-d array, which a replay writes
        result = np.array(result)
    cap.keep_written(before)
    if inputs is None:
        cap.ops.append(call)
        return result
    cap.ops.append(lambda: _into(result, call()))
    roots = {id(_root(x)) for x in _arrays(inputs)}
    if isinstance(result, np.ndarray) and id(_root(result)) not in roots:
        cap.made.append(result)
    return result


def _arrays(values):
    for v in values:
        if isinstance(v, np.ndarray):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _arrays(v)


def _refuse_while_capturing(what):
    if _capturing() is not None:
        raise StrictError(f"{what} while a stream is capturing (the GPU computes nothing then)")


class DevArray(np.ndarray):
    """An array 'on the GPU'."""

    @property
    def __cuda_array_interface__(self):
        """What marks a device array (singa.device.is_host); its pointer is a host one here."""
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3, "strides": None,
                "data": (self.data.ptr, False)}

    def __array_finalize__(self, obj):
        gpu = getattr(obj, "_gpu", None)      # a view: its base's device
        self._gpu = _Device.now() if gpu is None else gpu

    @property
    def data(self):
        """CuPy's MemoryPointer (the host buffer the numpy attribute gives stays out of
        reach)."""
        return _Pointer(self)

    @property
    def device(self):
        return _Device(self._gpu)

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        _check_ufunc(ufunc, method, out, kwargs)
        if method == "at":
            raise StrictError(f"{ufunc.__name__}.at on a device array: atomic adds, whose order "
                              f"varies")
        _check(inputs + (out or ()), f"{ufunc.__name__}.{method}")
        call = getattr(ufunc, method)
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in out)
            _run(lambda: call(*_plain(inputs), **kwargs), writes=out)
            return out[0] if len(out) == 1 else out
        return _dev(_run(lambda: call(*_plain(inputs), **kwargs), inputs=inputs))

    def __array_function__(self, func, types_, args, kwargs):
        _check_function(func, args, kwargs)
        _check(list(args) + list(kwargs.values()), func.__name__)

        def call():
            return func(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()})
        # some write into an argument (np.copyto): any may be written
        writes = list(_arrays(list(args) + list(kwargs.values())))
        if "out" in kwargs and kwargs["out"] is not None:
            _run(call, writes)
            return kwargs["out"]
        result = _run(call, writes, inputs=list(args) + list(kwargs.values()))
        if func is np.count_nonzero and isinstance(result, int):
            result = np.intp(result)
        return _dev(result)

    def __getitem__(self, index):
        _check(index if isinstance(index, tuple) else (index,), "indexing")
        def call():
            return np.ndarray.__getitem__(self.view(np.ndarray), _plain(index))
        basic = all(i is None or i is Ellipsis or isinstance(i, (int, np.integer, slice))
                    for i in (index if isinstance(index, tuple) else (index,)))
        if basic:       # a view (or an element), of any device's array
            view = _dev(call())
            view._gpu = self._gpu
            return view
        _check_here(self, "indexing")
        return _dev(_run(call, inputs=[self]))     # a gather

    def __setitem__(self, index, value):
        _check((self,) + (index if isinstance(index, tuple) else (index,)), "indexing")
        _check((value,), "assignment")
        _run(lambda: np.ndarray.__setitem__(self.view(np.ndarray), _plain(index), _plain(value)),
             writes=[self])

    # the methods that compute rather than view (numpy's own do not pass through the hooks)
    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):
        _check_here(self, "ndarray.astype")
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return _dev(_run(lambda: self.view(np.ndarray).astype(dtype, order, casting),
                         inputs=[self]))

    def copy(self, order="C"):
        _check_here(self, "ndarray.copy")
        return _dev(_run(lambda: self.view(np.ndarray).copy(order), inputs=[self]))

    def fill(self, value):
        _check_here(self, "ndarray.fill")
        _run(lambda: self.view(np.ndarray).fill(value), writes=[self])

    def __buffer__(self, flags):
        raise StrictError("a device array has no host buffer (bytes, ZeroMQ frames)")

    def tobytes(self, order="C"):
        raise StrictError("tobytes of a device array: copy it to the host first")

    def get(self, stream=None, order="C", out=None, blocking=True):
        """A host copy (cupy.ndarray.get), into `out` if given: without the host waiting where
        `out` is pinned and not `blocking`."""
        moved["to host"] += self.nbytes
        if out is None:
            return self._read(np.array)
        if type(out) is not np.ndarray or out.shape != self.shape or out.dtype != self.dtype:
            raise StrictError(f"get: out must be a host array of shape {self.shape} and dtype "
                              f"{self.dtype}")
        if blocking or not _pinned(out):
            return self._read(lambda a: np.copyto(out, a) or out)
        _run(lambda: np.copyto(out, self.view(np.ndarray)))
        return out

    def _read(self, convert):
        _refuse_while_capturing("a device value read on the host")
        queued[0] += 1
        waits["read"] += 1
        return convert(self.view(np.ndarray))

    def __float__(self):
        return self._read(float)

    def __int__(self):
        return self._read(int)

    def __bool__(self):
        return self._read(bool)

    def item(self, *args):
        return self._read(lambda a: a.item(*args))

    def set(self, values, stream=None):
        """Copy host `values` of the same shape and dtype in (cupy.ndarray.set): asynchronous
        from pinned memory on a `stream`, else the host waits."""
        if type(values) is not np.ndarray or values.shape != self.shape or \
                values.dtype != self.dtype:
            raise StrictError(f"set: needs a host array of shape {self.shape} and dtype "
                              f"{self.dtype}, got {type(values).__name__}")
        moved["to device"] += values.nbytes
        if stream is None or not _pinned(values):
            _refuse_while_capturing("a copy from pageable memory")
            waits["pageable copy"] += 1
        _run(lambda: np.copyto(self.view(np.ndarray), values), writes=[self])


#: numpy's ndarray methods that call ufuncs of their own choosing
_NUMPYS = {"all", "any", "clip", "cumprod", "cumsum", "max", "mean", "min", "prod", "round",
           "std", "sum", "trace", "var"}


def _method(name, method):
    """DevArray's `method` refusing what cupy.ndarray's `name` would not take (and leaving the
    ufuncs to numpy's method, where in _NUMPYS)."""
    takes, numpys = _takes(API["ndarray"][name]), name in _NUMPYS

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        why = _unfit(takes, len(args), kwargs)
        if why:
            raise StrictError(f"ndarray.{name}: {CUPY} has no " +
                              why.format(f"cupy.ndarray.{name}"))
        if not numpys:
            return method(self, *args, **kwargs)
        _in_numpy.value += 1
        try:
            return method(self, *args, **kwargs)
        finally:
            _in_numpy.value -= 1
    return call


def _wider(method, signature):
    """Whether DevArray's `method` takes a call (after self) that CuPy's of `signature` (not
    None) does not."""
    sig = inspect.signature(method)
    ours = _takes(str(sig.replace(parameters=[p.replace(default=p.empty)
                                              for p in list(sig.parameters.values())[1:]])))
    cupys = _takes(signature)
    return cupys[0] is not None and (ours[0] is None or ours[0] > cupys[0]) or \
        cupys[1] is not None and (ours[1] is None or not ours[1] <= cupys[1])


def _lacking(name):
    def refuse(self):
        raise Lacking(f"{CUPY} has no ndarray.{name}")
    return property(refuse)


# checked where numpy's take more (but `view`: numpy's takes (dtype, type) too, its signature
# says (*args, **kwargs))
for _name in set(dir(np.ndarray)) & set(API["ndarray"]) - {"view"}:
    if not _name.startswith("_") and API["ndarray"][_name] is not None and (
            _name in _NUMPYS or _wider(getattr(DevArray, _name), API["ndarray"][_name])):
        setattr(DevArray, _name, _method(_name, getattr(DevArray, _name)))
# all that cupy.ndarray lacks, but numpy's hooks of its own (pickling too) and those Python
# does without (`in`, `@=`)
for _name in set(dir(np.ndarray)) - set(API["ndarray"]) - set(vars(DevArray)) - {
        "__array_wrap__", "__setstate__", "__contains__", "__imatmul__"}:
    setattr(DevArray, _name, _lacking(_name))


def asarray(a, dtype=None):
    """A device array of `a` (copied from the host; a device array itself)."""
    if isinstance(a, DevArray):
        _check_here(a, "asarray")     # CuPy's would give the array where it is
    if isinstance(a, DevArray) and (dtype is None or a.dtype == dtype):
        return a
    _refuse_while_capturing("a copy from pageable memory")
    a = np.array(_plain(a), dtype=dtype)
    queued[0] += 1
    moved["to device"] += a.nbytes
    waits["pageable copy"] += 1
    return a.view(DevArray)


def _made(make, filled=True):
    """A creation function of device arrays: `make`'s array (filled by an operation unless
    `make` leaves it empty)."""
    def f(*args, **kwargs):
        if filled:
            return _run(lambda: make(*_plain(args), **kwargs), inputs=()).view(DevArray)
        a = make(*_plain(args), **kwargs)
        cap = _capturing()
        if cap is not None:
            cap.made.append(a)
        return a.view(DevArray)
    f.__name__ = make.__name__
    return f


zeros, ones, full, arange, zeros_like = (_made(getattr(np, n)) for n in (
    "zeros", "ones", "full", "arange", "zeros_like"))
empty, empty_like = _made(np.empty, False), _made(np.empty_like, False)


def _into(result, value):
    """Write an operation's `value` into its `result` of a first run (a replay)."""
    if isinstance(result, np.ndarray):
        np.copyto(result.view(np.ndarray), value)
    elif isinstance(result, tuple):
        for r, v in zip(result, value):
            _into(r, v)


#: the GPUs visible (`installed`)
_count = {0: 1}


#: every stand-in GPU's compute capability, as CuPy spells it ("90": an H100's 9.0)
_cc = {0: "90"}


class _Device:
    """cupy.cuda.Device: the thread's current device is its own (0 until it chooses)."""

    _here = threading.local()

    def __init__(self, i=None):
        self.id = _Device.now() if i is None else i
        if not 0 <= self.id < _count[0]:
            raise RuntimeError(f"cudaErrorInvalidDevice: no GPU {self.id} (of {_count[0]})")
        self.outer = []
        self.compute_capability = _cc[0]

    @staticmethod
    def now():
        return getattr(_Device._here, "id", 0)

    def use(self):
        _Device._here.id = self.id

    def __enter__(self):
        self.outer.append(_Device.now())
        _Device._here.id = self.id
        return self

    def __exit__(self, *exc):
        _Device._here.id = self.outer.pop()

    def __eq__(self, other):
        return isinstance(other, _Device) and other.id == self.id

    def __hash__(self):
        return self.id

    def synchronize(self):
        _refuse_while_capturing("a wait for a device")


class _Pointer:
    """cupy.cuda.MemoryPointer of device array `a`: `ptr` the address of its first element."""

    def __init__(self, a):
        self.array, self.ptr = a, a.view(np.ndarray).__array_interface__["data"][0]
        self.device_id = a._gpu

    def copy_from_device_async(self, src, size, stream=None):
        """Copy `size` bytes from `src` (of any device) here, queued on `stream`: both arrays'
        whole C-contiguous memory."""
        dst, frm = self.array, src.array
        for a in (dst, frm):
            if not a.flags.c_contiguous or a.nbytes != size:
                raise StrictError(f"copy_from_device_async: {size} bytes of an array of "
                                  f"{a.nbytes} (contiguous: {a.flags.c_contiguous})")
        moved["between devices" if frm._gpu != dst._gpu else "within a device"] += size
        _run(lambda: np.copyto(dst.view(np.ndarray).reshape(-1).view(np.uint8),
                               frm.view(np.ndarray).reshape(-1).view(np.uint8)), writes=[dst])


class _Pinned(bytearray):
    """Page-locked host memory (cupy.cuda.alloc_pinned_memory)."""


def _pinned(a):
    """True when host array `a` lies in pinned memory."""
    while isinstance(a, np.ndarray):
        a = a.base
    return isinstance(a.obj if isinstance(a, memoryview) else a, _Pinned)


class _Event:
    """cupy.cuda.Event: every launch here has finished when it returns."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.recorded = None

    def record(self, stream=None):
        self.recorded = queued[0]
        self.device = _Device.now()

    def synchronize(self):
        if self.recorded is not None:
            event_waits.append(queued[0] - self.recorded)


class Stream:
    """cupy.cuda.Stream: `with stream:` makes it the thread's current one; it captures between
    `begin_capture` and `end_capture` (the legacy default stream, `Stream.null`, cannot)."""

    _current = threading.local()

    def __init__(self, null=False, non_blocking=False, ptr=None):
        self.ptr = 0 if null else id(self)

    def __enter__(self):
        outer = getattr(Stream._current, "stack", None)
        if outer is None:
            outer = Stream._current.stack = []
        outer.append(self)
        return self

    def __exit__(self, *exc):
        Stream._current.stack.pop()

    def synchronize(self):
        _refuse_while_capturing("a wait for a stream")

    def wait_event(self, event):
        """Later work on this stream waits for `event` (of any device)."""
        if event.recorded is None:
            raise StrictError("wait_event for an event never recorded")

    def begin_capture(self, mode=None):
        if self.ptr == 0:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if threading.get_ident() in _captures:
            raise StrictError("this thread has a capture under way")
        _captures[threading.get_ident()] = _Capture(self)

    def end_capture(self):
        cap = _captures.pop(threading.get_ident(), None)
        if cap is None or cap.stream is not self:
            raise StrictError("end_capture on a stream that is not capturing")
        return cap.end()

    def is_capturing(self):
        return any(cap.stream is self for cap in list(_captures.values()))


Stream.null = Stream(null=True)


def get_current_stream():
    stack = getattr(Stream._current, "stack", None)
    return stack[-1] if stack else Stream.null


class Graph:
    """cupy.cuda.Graph: the operations a capture recorded, replayed in order by `launch`."""

    def __init__(self, ops):
        self.ops = ops

    def launch(self, stream=None):
        _refuse_while_capturing("a graph launch")      # CUDA could; nothing here does
        queued[0] += 1
        for op in self.ops:
            op()


class MemoryPool:
    """cupy.cuda.MemoryPool: allocations here are numpy's."""

    def malloc(self, size):
        raise StrictError("the stand-in allocates with numpy")


cuda = types.SimpleNamespace(Device=_Device, Event=_Event, Stream=Stream, Graph=Graph,
                             MemoryPool=MemoryPool, alloc_pinned_memory=_Pinned,
                             get_elapsed_time=lambda start, end: 0.0,   # no clock here
                             get_current_stream=get_current_stream,
                             using_allocator=lambda allocator=None: contextlib.nullcontext(),
                             runtime=types.SimpleNamespace(getDeviceCount=lambda: _count[0]))


def installed(monkeypatch, gpus=1):
    """Make singa.device take this module for cupy, with GPUs 0 to `gpus` - 1 visible."""
    from singa import device
    module = sys.modules[__name__]
    monkeypatch.setitem(_count, 0, gpus)
    monkeypatch.setattr(device, "cupy", lambda: module)
    monkeypatch.setitem(sys.modules, __name__.partition(".")[0], module)
    return module


# ---- CUDA kernels (singa.layers.kernels.cuda): run on the CPU through tests/cuda_shim.py ----

import cuda_shim   # noqa: E402  (kept apart from the rest of the stand-in)


def ascontiguousarray(a, dtype=None):
    """A C-contiguous device array of `a` (`a`'s memory where it is one)."""
    if a.flags.c_contiguous and (dtype is None or a.dtype == dtype):
        return a
    return _run(lambda: np.ascontiguousarray(_plain(a), dtype), inputs=[a]).view(DevArray)


class RawKernel(cuda_shim.RawKernel):
    """cupy.RawKernel: `code`'s kernel `name`, built by the C++ compiler (cuda_shim) at its
    first launch; its grid runs serially, on device arrays only. Skips the test where no
    compiler is found."""

    def __call__(self, grid, block, args, shared_mem=0):
        _check(args, f"kernel {self.name}")
        if cuda_shim.compiler() is None:
            import pytest
            pytest.skip("no C++ compiler to run the CUDA kernels on the CPU")

        def call():
            try:
                super(RawKernel, self).__call__(grid, block, _plain(tuple(args)), shared_mem)
            except TypeError as e:
                raise StrictError(str(e)) from None
        _run(call, writes=list(_arrays(args)))
