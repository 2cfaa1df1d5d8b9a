"""Msg: SINGA's message (src/comm/msg.cc): header ints, a body of frames, addresses and format frames.

On a socket a message is the frame `"src dst type trgt_val trgt_version"` followed by the body
frames. Arrays travel by reference (`p` format items: a key into this process's pointer table,
SINGA's raw pointer) between threads of one process, and as raw float32 data frames between
processes (the multi-process runtime, not built yet).
"""
import struct

from singa.errors import ClusterError
from singa.proto import common_pb2

kGet, kPut, kUpdate, kStop = common_pb2.kGet, common_pb2.kPut, common_pb2.kUpdate, common_pb2.kStop
kRGet, kRUpdate, kConnect = common_pb2.kRGet, common_pb2.kRUpdate, common_pb2.kConnect
kWorkerParam = common_pb2.kWorkerParam
kServer, kStub = common_pb2.kServer, common_pb2.kStub


def addr(grp, id_or_proc, entity):
    """(grp << 16) | (id << 8) | entity type, as SINGA's Addr."""
    return (grp << 16) | ((id_or_proc & 0xff) << 8) | entity


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
        try:
            src, dst, type_, val, version = (int(x) for x in bytes(frames[0]).split())
        except (ValueError, IndexError):
            raise ClusterError(f"malformed message header {bytes(frames[0])[:40]!r}") from None
        return cls(src, dst, type_, val, version, frames[1:])

    def reply(self, type_, trgt_version, frames=()):
        return Msg(self.dst, self.src, type_, self.trgt_val, trgt_version, frames)

    def __repr__(self):
        return (f"Msg(src={self.src}, dst={self.dst}, type={self.type}, "
                f"trgt=({self.trgt_val}, {self.trgt_version}), {len(self.frames)} frames)")


# --- format frames (SINGA's AddFormatFrame / ParseFormatFrame) -------------------------------
_MAGIC = b"*singa*\0"
_POINTERS = {}


def pointer(arr):
    """A key for `arr` in this process's pointer table (SINGA passes raw pointers in-process)."""
    key = id(arr)
    _POINTERS[key] = arr
    return key


def deref(key):
    return _POINTERS[key]


def format_frame(fmt, *values):
    """`*singa*\\0` then per item: i int32, f float32, s bytes\\0, p pointer, 1/2/4 raw uints."""
    out = [_MAGIC]
    for c, v in zip(fmt, values, strict=True):
        if c == "i":
            out.append(b"i" + struct.pack("<i", v))
        elif c == "f":
            out.append(b"f" + struct.pack("<f", v))
        elif c == "s":
            out.append(b"s" + v + b"\0")
        elif c == "p":
            out.append(b"p" + struct.pack("<q", pointer(v)))
        elif c in "124":
            out.append(struct.pack({"1": "<B", "2": "<H", "4": "<I"}[c], v))
        else:
            raise ValueError(f"unknown format character {c!r}")
    return b"".join(out)


def parse_format_frame(fmt, frame):
    """Values of a format frame made by `format_frame(fmt, ...)`; pointers are dereferenced."""
    buf = bytes(frame)
    if not buf.startswith(_MAGIC):
        raise ClusterError("message frame is not a SINGA format frame")
    pos, out = len(_MAGIC), []
    for c in fmt:
        if c in "124":
            code = {"1": "<B", "2": "<H", "4": "<I"}[c]
            out.append(struct.unpack_from(code, buf, pos)[0])
            pos += struct.calcsize(code)
            continue
        if buf[pos:pos + 1] != c.encode():
            raise ClusterError(f"format frame: expected {c!r} at byte {pos}")
        pos += 1
        if c == "i":
            out.append(struct.unpack_from("<i", buf, pos)[0])
            pos += 4
        elif c == "f":
            out.append(struct.unpack_from("<f", buf, pos)[0])
            pos += 4
        elif c == "s":
            end = buf.index(b"\0", pos)
            out.append(buf[pos:end])
            pos = end + 1
        elif c == "p":
            out.append(deref(struct.unpack_from("<q", buf, pos)[0]))
            pos += 8
    return out
