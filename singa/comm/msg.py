"""Msg: SINGA's message (src/comm/msg.cc): header ints, a body of frames, addresses and format frames.

Inside a process a message is handed over as it is (`singa.comm.socket`): an array frame is
the sender's array itself, of the host or of a GPU, which the receiver may keep as an alias
(`same_memory` tells). To another process a message goes as ZeroMQ frames: the frame
`"src dst type trgt_val trgt_version"`, then the body, a GPU array's values copied to the host
(`host_frame`); it arrives as bytes-like frames, which `frame_array` views as float32 values.
Display metrics travel as numbers too (`metric_frames`: names, then float64 values).
"""
import functools
import struct

import numpy as np

from singa import device
from singa.device import host, is_host
from singa.errors import ClusterError
from singa.proto import common_pb2

kGet, kPut, kUpdate, kStop = common_pb2.kGet, common_pb2.kPut, common_pb2.kUpdate, common_pb2.kStop
kRGet, kRUpdate = common_pb2.kRGet, common_pb2.kRUpdate
kRPut, kState, kRState = common_pb2.kRPut, common_pb2.kState, common_pb2.kRState
kError, kSnapshot, kConnect = common_pb2.kError, common_pb2.kSnapshot, common_pb2.kConnect
kSyncRequest, kSyncResponse = common_pb2.kSyncRequest, common_pb2.kSyncResponse
kData, kMetric = common_pb2.kData, common_pb2.kMetric
kWorkerParam, kWorkerLayer = common_pb2.kWorkerParam, common_pb2.kWorkerLayer
kServer, kStub = common_pb2.kServer, common_pb2.kStub


def addr(grp, id_or_proc, entity):
    """(grp << 16) | (id << 8) | entity type, as SINGA's Addr."""
    return (grp << 16) | ((id_or_proc & 0xff) << 8) | entity


#: a process's stub (SINGA's Addr(-1, -1, kStub)): where its executors send
STUB = addr(-1, -1, kStub)


def addr_grp(a):
    return a >> 16


def addr_id(a):
    return (a >> 8) & 0xff


def addr_type(a):
    return a & 0xff


def param_trgt(param_id, slice_id):
    return (param_id << 16) | slice_id


def param_id(trgt):
    return trgt >> 16


def slice_id(trgt):
    return trgt & 0xffff


class Msg:
    """A message: `src`, `dst`, `type`, `trgt_val`, `trgt_version` and body `frames` (bytes-like)."""
    __slots__ = ("src", "dst", "type", "trgt_val", "trgt_version", "frames")

    def __init__(self, src, dst, type_, trgt_val=0, trgt_version=0, frames=()):
        self.src, self.dst, self.type = src, dst, type_
        self.trgt_val, self.trgt_version = trgt_val, trgt_version
        self.frames = list(frames)

    def header(self):
        return b"%d %d %d %d %d" % (self.src, self.dst, self.type, self.trgt_val, self.trgt_version)

    @classmethod
    def from_frames(cls, frames):
        head = bytes(frames[0])[:100] if frames else b""
        try:
            src, dst, type_, val, version = (int(x) for x in head.split())
        except ValueError:
            raise ClusterError(f"malformed message header {head[:40]!r}") from None
        if not all(-2**31 <= x < 2**31 for x in (src, dst, type_, val)):
            raise ClusterError(f"message header out of range {head[:40]!r}")
        return cls(src, dst, type_, val, version, frames[1:])

    def reply(self, type_, trgt_version, frames=()):
        return Msg(self.dst, self.src, type_, self.trgt_val, trgt_version, frames)

    def __repr__(self):
        return (f"Msg(src={self.src}, dst={self.dst}, type={self.type}, "
                f"trgt=({self.trgt_val}, {self.trgt_version}), {len(self.frames)} frames)")


# --- array frames ------------------------------------------------------------------------
def array_frame(a):
    """A float32 array as a frame, flat, not copied: it must outlive the message and stay
    unchanged until read (`device.host_copy` for values about to change)."""
    return _flat(a)


def _flat(a):
    """`a` as one axis: itself where it has one (a GPU array's view costs microseconds)."""
    return a if a.ndim == 1 else a.reshape(-1)


def host_frame(frame):
    """`frame` as another process can read it: a GPU array's values copied to the host.
    (pyzmq sends a host ndarray several times faster than a memoryview: 8 against 33 us.)"""
    return host(frame) if hasattr(frame, "__cuda_array_interface__") else frame


def frame_array(frame, n=None):
    """The float32 values of `frame`, which must hold exactly `n` of them (None: any number),
    without copying: the array a sender in this process handed over, or a view of the bytes
    of another process's frame."""
    # the type's attribute: a CuPy array's own builds a dict
    if isinstance(frame, np.ndarray) or hasattr(type(frame), "__cuda_array_interface__"):
        if frame.dtype != _FLOAT32 or n is not None and frame.size != n:
            raise ClusterError(f"array frame of {frame.size} {frame.dtype} values where "
                               f"{_expected(n)} were expected")
        return _flat(frame)
    buf = frame.buffer if hasattr(frame, "buffer") else frame
    nbytes = memoryview(buf).nbytes
    if nbytes % 4 if n is None else nbytes != 4 * n:
        raise ClusterError(f"array frame of {nbytes} bytes where {_expected(n)} were expected")
    return np.frombuffer(buf, np.float32)


_FLOAT32 = np.dtype(np.float32)


def _expected(n):
    return "float32 values" if n is None else f"{n} float32 values"


def same_memory(a, b):
    """True when `a` and `b` start at the same address, both of the host or both of a device
    (a frame aliasing a local array)."""
    if is_host(a) != is_host(b):
        return False
    if is_host(a) and _aligned_float32(a) and _aligned_float32(b):
        # their first elements, 4 bytes at multiples of 4, overlap only where they start
        # together: numpy's bounds check, a fifth of the time of the two addresses
        return np.may_share_memory(a[:1], b[:1])
    return device.address(a) == device.address(b)


def _aligned_float32(a):
    """`a` is a non-empty 1-D float32 host array at a multiple of 4 bytes."""
    return a.ndim == 1 and a.size > 0 and a.dtype == _FLOAT32 and a.flags.aligned


class OrderedSum:
    """The gradients of one param from several senders, summed in the order of their
    addresses, so the float32 sum does not depend on the order they arrived in: the one
    gradient itself when alone, else in a buffer of its own (made on first need, never a
    sender's array) where the first sender's gradient lies (the others copied there from
    another device, or the host)."""

    def __init__(self, size):
        self.size = size
        self.items = []         # (sender address, gradient)
        self.buffer = None

    def add(self, src, grad):
        """Hold `grad` of sender `src`; returns how many are held."""
        self.items.append((src, grad))
        return len(self.items)

    def take(self):
        """The sum of the held gradients; holds none afterwards."""
        items, self.items = self.items, []
        if len(items) == 1:
            return items[0][1]
        items.sort(key=lambda t: t[0])
        first = items[0][1]
        with device.on(first):
            if self.buffer is None:
                self.buffer = np.empty_like(first, shape=self.size)     # on first's device
            g = np.add(first, device.like(first, items[1][1]), out=self.buffer)
            for _, other in items[2:]:
                g += device.like(first, other)
        return g


# --- format frames (SINGA's AddFormatFrame / ParseFormatFrame, without pointers) -----------
_MAGIC = b"*singa*\0"
_CODES = {"i": "<i", "f": "<f"}


@functools.lru_cache(maxsize=64)
def _numbers(fmt):
    """The struct of the items of a format frame of `fmt`, up to 16 of them, all i or f (else
    None): per item its code byte, then its value; and the code bytes."""
    if not 0 < len(fmt) <= 16 or not set(fmt) <= set(_CODES):
        return None
    codes = tuple(c.encode() for c in fmt)
    return struct.Struct("<" + "".join("c" + _CODES[c][1] for c in fmt)), codes


def format_frame(fmt, *values):
    """`*singa*\\0` then per item: i int32, f float32, s bytes\\0."""
    numbers = _numbers(fmt)
    if numbers is not None and len(values) == len(fmt):
        packer, codes = numbers
        return _MAGIC + packer.pack(*[x for item in zip(codes, values) for x in item])
    out = [_MAGIC]
    for c, v in zip(fmt, values, strict=True):
        if c in _CODES:
            out.append(c.encode() + struct.pack(_CODES[c], v))
        elif c == "s":
            out.append(b"s" + v + b"\0")
        else:
            raise ValueError(f"unknown format character {c!r}")
    return b"".join(out)


@functools.lru_cache(maxsize=256)
def int_frame(values):
    """A format frame of the int32 items of tuple `values`, any number of them (made once per
    `values`: a param's offsets and share counts are the same every step)."""
    return format_frame("i" * len(values), *values)


def parse_int_frame(frame):
    """The int32 items (a tuple) of a frame made by `int_frame`; one handed over in-process
    (bytes, the same object every step) is parsed once."""
    return _parse_ints(frame) if type(frame) is bytes else _ints(frame)


def _ints(frame):
    size = len(frame.buffer if hasattr(frame, "buffer") else frame) - len(_MAGIC)
    if size % 5:
        raise ClusterError("malformed integer frame")
    return tuple(parse_format_frame("i" * (size // 5), frame))


_parse_ints = functools.lru_cache(maxsize=256)(_ints)


def parse_format_frame(fmt, frame):
    """Values of a format frame made by `format_frame(fmt, ...)`; ClusterError if malformed."""
    buf = bytes(frame.buffer if hasattr(frame, "buffer") else frame)
    if not buf.startswith(_MAGIC):
        raise ClusterError("message frame is not a SINGA format frame")
    numbers = _numbers(fmt)
    if numbers is not None and len(buf) >= len(_MAGIC) + numbers[0].size:
        items = numbers[0].unpack_from(buf, len(_MAGIC))
        if items[::2] == numbers[1]:
            return list(items[1::2])
    pos, out = len(_MAGIC), []
    try:
        for c in fmt:
            if buf[pos:pos + 1] != c.encode():
                raise ClusterError(f"format frame: expected {c!r} at byte {pos}")
            pos += 1
            if c == "s":
                end = buf.index(b"\0", pos)
                out.append(buf[pos:end])
                pos = end + 1
            else:
                out.append(struct.unpack_from(_CODES[c], buf, pos)[0])
                pos += 4
    except (struct.error, ValueError):
        raise ClusterError(f"format frame truncated at byte {pos}") from None
    return out


def error_frames(kind, text):
    """The frames of a kError: [ss: the error's type name, its message]."""
    return [format_frame("ss", kind.encode(), text.encode())]


def parse_error_frames(frames):
    """(type name, message) of a kError's frames; ClusterError if malformed."""
    if not frames:
        raise ClusterError("error report without its text")
    kind, text = parse_format_frame("ss", frames[0])
    return kind.decode(errors="replace"), text.decode(errors="replace")


def metric_frames(rows):
    """Frames of metric `rows` ({name: value} per layer): per row, the names joined by tabs and
    the values as float64."""
    frames = []
    for values in rows:
        frames += ["\t".join(values).encode(), np.array(list(values.values()), np.float64).tobytes()]
    return frames


def frame_metrics(frames):
    """The metric rows `metric_frames` made; ClusterError for frames it did not make."""
    if len(frames) % 2:
        raise ClusterError("display metrics: an odd number of frames")
    rows = []
    for names, values in zip(frames[::2], frames[1::2]):
        keys = bytes(names).decode(errors="replace").split("\t") if len(names) else []
        if len(values) != 8 * len(keys):
            raise ClusterError(f"display metrics: {len(keys)} names but {len(values)} bytes")
        rows.append(dict(zip(keys, np.frombuffer(bytes(values), np.float64).tolist())))
    return rows
