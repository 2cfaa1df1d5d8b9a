"""Protocol buffers' wire format by hand, for messages whose packed floats are too big to go
through protobuf (SINGA's snapshot files, `checkpoint/wire.py`; Caffe's binary files,
`io/caffe_blobs.py`, `interop/caffe/write.py`): varints, field keys, a checked walk over a message's
fields, and packed floats as views of the bytes that hold them.

The rules are protobuf's, as its Python library (upb) reads them; tests/unit/test_protowire.py
holds the two side by side:
- a varint is 7 bits a byte, low first, the high bit set on all but the last; at most 10 bytes,
  read modulo 2**64; an int32 or int64 field writes a negative number as its 64-bit two's
  complement (10 bytes);
- a key is field number << 3 | wire type, as a varint of at most 5 bytes under 2**32 (so the
  number is 1 .. 2**29 - 1); so is the length before a length-delimited field's bytes;
- groups (wire types 3 and 4) are not walked: no message of ours or Caffe's has one.
The walk compares every length with the bytes that remain before it goes on, so a length the
bytes merely claim is never read past nor allocated.
"""
import numpy as np

__all__ = ["VARINT", "FIXED64", "LEN", "FIXED32", "MAX_FIELD", "WireError", "varint", "key",
           "prefix", "read_varint", "read_key", "int64", "fields", "floats"]

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5      # wire types; 3 and 4 open and close a group
MAX_FIELD = (1 << 29) - 1
_FIXED_SIZE = {FIXED64: 8, FIXED32: 4}
_ONE_BYTE = [bytes((i,)) for i in range(0x80)]


class WireError(ValueError):
    """Bytes that are not a message we can walk (truncated, malformed, or a group); `pos` is
    the offset where it shows. Callers re-raise it as their own error, with the file's name."""

    def __init__(self, what, pos):
        super().__init__(what)
        self.pos = pos


def varint(n):
    """The varint of the integer -2**63 <= `n` < 2**64; a negative `n` as its 64-bit two's
    complement (10 bytes), as protobuf writes a negative int32 or int64."""
    if 0 <= n < 0x80:
        return _ONE_BYTE[n]
    if n < 0:
        if n < -(1 << 63):
            raise ValueError(f"{n} is below -2**63: not an int64")
        n += 1 << 64
    elif n >> 64:
        raise ValueError(f"{n} is 2**64 or more: not a uint64")
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def key(number, wire_type):
    """The key of field `number` holding a value of `wire_type`."""
    if not 1 <= number <= MAX_FIELD or wire_type not in (VARINT, FIXED64, LEN, 3, 4, FIXED32):
        raise ValueError(f"no key for field {number} of wire type {wire_type}")
    return varint(number << 3 | wire_type)


def prefix(number, size):
    """The key and the length that open the length-delimited field `number` of `size` bytes
    (a message, a string, packed values)."""
    return key(number, LEN) + varint(size)


def read_varint(data, pos=0, end=None):
    """(value, offset after it) of the varint at data[pos], read no further than `end` (by
    default the end of `data`); the value unsigned, modulo 2**64 (`int64` of it for a signed
    field). Raises WireError when it runs past `end` or is longer than 10 bytes."""
    return _varint(data, pos, len(data) if end is None else min(end, len(data)), 10)


def read_key(data, pos=0, end=None):
    """(field number, wire type, offset after the key) of the key at data[pos]; raises
    WireError on a key protobuf refuses (past `end`, longer than 5 bytes, 2**32 or more, field
    number 0)."""
    k, after = _varint(data, pos, len(data) if end is None else min(end, len(data)), 5)
    if k >> 3 == 0:
        raise WireError(f"field number 0 at byte {pos}", pos)
    return k >> 3, k & 7, after


def int64(value):
    """A varint's value as a signed field (int32, int64) holds it: two's complement, 64 bits."""
    return value - (1 << 64) if value >> 63 else value


def fields(data, start=0, end=None):
    """Walk the message data[start:end] field by field: yield (number, wire type, tag, start,
    end, value) of each, `tag` the offset of its key, data[start:end] its value's bytes (of a
    length-delimited field: the payload after the length), `value` a varint's value or a fixed
    field's (unsigned, little-endian), None for a length-delimited field.

    `data` is anything indexable by byte and sliceable (bytes, memoryview, mmap). Raises
    WireError as soon as a key, a varint or a length does not fit in what remains."""
    end = len(data) if end is None else end
    if not 0 <= start <= end <= len(data):
        raise ValueError(f"bytes {start}:{end} of {len(data)}")
    pos = start
    while pos < end:
        # the one-byte key, length and varint inline: most are, and a call costs more
        k = data[pos]
        if k < 0x80:
            s = pos + 1
        else:
            k, s = _varint(data, pos, end, 5)
        number, wire_type = k >> 3, k & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {pos}", pos)
        if wire_type == LEN:
            n = data[s] if s < end else 0x80
            if n < 0x80:
                s += 1
            else:
                n, s = _varint(data, s, end, 5)
            if n > end - s:
                raise WireError(f"field {number} at byte {pos} claims {n} bytes, {end - s} "
                                f"remain", pos)
            value, e = None, s + n
        elif wire_type == VARINT:
            value = data[s] if s < end else 0x80
            if value < 0x80:
                e = s + 1
            else:
                value, e = _varint(data, s, end, 10)
        elif wire_type in _FIXED_SIZE:
            e = s + _FIXED_SIZE[wire_type]
            if e > end:
                raise WireError(f"field {number} at byte {pos} needs {e - s} bytes, {end - s} "
                                f"remain", pos)
            value = int.from_bytes(data[s:e], "little")
        else:
            raise WireError(f"field {number} at byte {pos} has wire type {wire_type}"
                            f"{' (a group)' if wire_type in (3, 4) else ''}", pos)
        yield number, wire_type, pos, s, e, value
        pos = e


def floats(data, start=0, end=None, dtype="<f4"):
    """The packed values data[start:end] as a 1-D array viewing `data` (no copy; read-only
    where `data` is): little-endian float32, or `dtype` ("<f8" for packed doubles). Raises
    WireError when the bytes are not a whole number of values."""
    end = len(data) if end is None else end
    size = np.dtype(dtype).itemsize
    if (end - start) % size:
        raise WireError(f"packed values of {end - start} bytes at byte {start} are not whole "
                        f"{size}-byte values", start)
    return np.frombuffer(data, dtype, (end - start) // size, start)


def _varint(data, pos, end, longest):
    """read_varint's work; a varint of `longest` = 5 bytes (a key, a length) must also be
    under 2**32."""
    value = shift = 0
    i = pos
    stop = pos + longest
    if stop > end:
        stop = end
    while i < stop:
        b = data[i]
        i += 1
        if b < 0x80:
            value |= b << shift
            if shift < 28:
                return value, i
            if longest == 5 and value >> 32:
                raise WireError(f"a varint32 at byte {pos} is 2**32 or more", pos)
            return value & 0xFFFFFFFFFFFFFFFF, i
        value |= (b & 0x7F) << shift
        shift += 7
    if end - pos < longest:
        raise WireError(f"a varint at byte {pos} runs past the end, byte {end}", pos)
    raise WireError(f"a varint at byte {pos} is longer than {longest} bytes", pos)
