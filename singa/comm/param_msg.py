"""Param messages: every message about a param is built and parsed here (SINGA's
Param::GenPutMsg / GenGetMsg / GenUpdateMsg and their Parse*, src/utils/param.cc).

`trgt_val` is (param id, slice id) (`msg.param_trgt`): a worker's request names its owner param
and slice 0, the stub's requests and the servers' answers one slice; `trgt_version` is the
version asked for or reached. Updates travel in buckets: a worker's Update carries the
gradients of several params, the stub's one per server the slices of that server, and the
answers come back the same way (`trgt_val` 0, the params named in an int frame). Arrays travel
as float32 frames (`msg.array_frame`): in-process a frame is the sender's array (of the host or
of a GPU), which must stay unchanged until read; values that will change go as a host copy
(`device.host_copy`).

  worker -> stub     kPut     [ffi: lr_scale, wd_scale, lr_index; values; updater buffers...]
                     kGet     []
                     kUpdate  [i: owner ids; their gradients]
                     kState   []
  stub -> server     kPut     [iffii: size, lr_scale, wd_scale, num_total, lr_index;
  (one per slice)              values; updater buffers...]
                     kGet     []
                     kState   []
  stub -> server     kUpdate  [i: (owner, slice, num_local) per slice; per slice the sum of
  (one per server)             the stub's num_local gradients]
  server -> stub     kRPut [ii: updater buffers kept, 1 if the Put's were dropped],
                     kRGet [values], kRState [i: lr_index; a copy of each updater buffer];
                     kRUpdate [i: (owner, slice) per slice; their values], one per stub and
                     version, for the slices an Update completed
  stub -> worker     the answers of every slice of one or more params, once all have come:
                     [i: (param id, slice count, offsets...) per param; each slice's frames,
                     param by param, in slice order]
  server -> master   kSyncRequest [values - values at the last sync] (Distributed Hogwild)
  master -> server   kSyncResponse [the master's values after adding them]

lr_index -1 in a Put keeps the server's learning-rate position. Parsers raise ClusterError for
a message they did not build (it is dropped), never write outside the param.
"""
import functools

import numpy as np

from singa.comm import msg as m
from singa.device import assign, host_copy
from singa.errors import ClusterError


# --- worker -> stub ----------------------------------------------------------------------
def put(src, dst, owner, version, lr_scale, wd_scale, lr_index, values, buffers=()):
    """A worker's Put of its owner param's `values` (and updater `buffers` on a resume)."""
    frames = [m.format_frame("ffi", lr_scale, wd_scale, lr_index), m.array_frame(values)]
    frames += [m.array_frame(b) for b in buffers]
    return m.Msg(src, dst, m.kPut, m.param_trgt(owner, 0), version, frames)


def parse_put(msg, size):
    """(lr_scale, wd_scale, lr_index, [values, buffers...]) of a worker's Put."""
    if len(msg.frames) < 2:
        raise ClusterError("Put without values")
    lr_scale, wd_scale, lr_index = m.parse_format_frame("ffi", msg.frames[0])
    return lr_scale, wd_scale, lr_index, [m.frame_array(f, size) for f in msg.frames[1:]]


def request(src, dst, type_, owner, version, sid=0):
    """A kGet or kState of param `owner` (slice `sid`)."""
    return m.Msg(src, dst, type_, m.param_trgt(owner, sid), version)


def update(src, dst, version, owners, grads):
    """A worker's Update: the gradients `grads` of its owner params `owners` (a bucket)."""
    return _bundle(src, dst, m.kUpdate, version, tuple(owners), grads)


def parse_update(msg):
    """[(owner id, gradient frame)] of a worker's Update (`m.frame_array` checks a frame's
    size against its param's)."""
    return list(zip(*_unbundle(msg, 1, "Update")))


# --- stub -> server ----------------------------------------------------------------------
def slice_put(src, server, owner, sid, version, lr_scale, wd_scale, num_total, lr_index, arrays):
    """The Put of one slice: `arrays` are its values and updater buffers."""
    head = m.format_frame("iffii", arrays[0].size, lr_scale, wd_scale, num_total, lr_index)
    return m.Msg(src, server, m.kPut, m.param_trgt(owner, sid), version,
                 [head] + [m.array_frame(a) for a in arrays])


def parse_slice_put(msg):
    """(lr_scale, wd_scale, num_total, lr_index, values, [updater buffers]) of a slice's Put."""
    if len(msg.frames) < 2:
        raise ClusterError(f"Put of slice {m.slice_id(msg.trgt_val)} without values")
    n, lr_scale, wd_scale, num_total, lr_index = m.parse_format_frame("iffii", msg.frames[0])
    if n < 0 or num_total < 1:
        raise ClusterError(f"malformed Put of slice {m.slice_id(msg.trgt_val)}")
    arrays = [m.frame_array(f, n) for f in msg.frames[1:]]
    return lr_scale, wd_scale, num_total, lr_index, arrays[0], arrays[1:]


def slice_update(src, server, version, items):
    """The Update of slices `items` [(owner, slice id, num_local, gradient)] of one server:
    each gradient the sum of `num_local` shares'."""
    return _bundle(src, server, m.kUpdate, version, tuple(x for item in items for x in item[:3]),
                   [item[3] for item in items])


def parse_slice_update(msg):
    """[(owner, slice id, num_local, gradient frame)] of the stub's Update of slices."""
    ints, frames = _unbundle(msg, 3, "Update of slices")
    return list(zip(ints[::3], ints[1::3], ints[2::3], frames))


# --- server -> stub ----------------------------------------------------------------------
def put_reply(req, version, nbuffers, dropped):
    """kRPut to `req`: the slice keeps `nbuffers` updater buffers; `dropped`: not the Put's
    (another updater's, of a snapshot), so its state starts afresh."""
    return req.reply(m.kRPut, version, [m.format_frame("ii", nbuffers, int(dropped))])


def values_reply(req, version, values):
    """kRGet to `req`: the slice's values (aliased in-process: unchanged until read)."""
    return req.reply(m.kRGet, version, [m.array_frame(values)])


def updated(src, dst, version, items):
    """kRUpdate to stub `dst`: the values of slices `items` [(owner, slice id, values)], all
    at `version` (aliased in-process: unchanged until read)."""
    return _bundle(src, dst, m.kRUpdate, version, tuple(x for item in items for x in item[:2]),
                   [item[2] for item in items])


def parse_updated(msg):
    """[(owner, slice id, [values frame])] of a server's kRUpdate."""
    ints, frames = _unbundle(msg, 2, "kRUpdate")
    return [(owner, sid, [f]) for owner, sid, f in zip(ints[::2], ints[1::2], frames)]


def state_reply(req, version, lr_index, buffers):
    """kRState to `req`: the learning-rate index and copies of the slice's updater buffers."""
    return req.reply(m.kRState, version,
                     [m.format_frame("i", lr_index)] + [m.array_frame(host_copy(b)) for b in buffers])


def sync(src, dst, type_, trgt_val, version, values):
    """A kSyncRequest (the delta) or kSyncResponse (the master's values) of one slice."""
    return m.Msg(src, dst, type_, trgt_val, version, [m.array_frame(values)])


def parse_sync(msg, size):
    """The values of a kSyncRequest or kSyncResponse."""
    if len(msg.frames) != 1:
        raise ClusterError(f"sync message of slice {m.slice_id(msg.trgt_val)} without values")
    return m.frame_array(msg.frames[0], size)


# --- buckets ------------------------------------------------------------------------------
def _bundle(src, dst, type_, version, numbers, arrays):
    """A message of several items: one int frame of every item's `numbers` (a tuple, as many
    each, one item after the other), then each item's array."""
    return m.Msg(src, dst, type_, 0, version, [m.int_frame(numbers), *map(m.array_frame, arrays)])


def _unbundle(msg, per, what):
    """(the numbers, the array frames) of a `_bundle` of `per` numbers an item."""
    if len(msg.frames) < 2:
        raise ClusterError(f"{what} without arrays")
    ints, frames = m.parse_int_frame(msg.frames[0]), msg.frames[1:]
    if len(ints) != per * len(frames):
        raise ClusterError(f"malformed {what}: {len(ints)} numbers for {len(frames)} arrays")
    return ints, frames


# --- stub -> worker ----------------------------------------------------------------------
def gathered(src, dst, type_, version, params):
    """The answers of every slice of `params` [(param id, offsets, answers)] (`answers[k]`:
    slice k's frames, which starts at `offsets[k]`) as one message to worker `dst`."""
    ints, frames = [], []
    for pid, offsets, answers in params:
        ints += (pid, len(offsets), *offsets)
        for slice_frames in answers:
            frames += slice_frames
    return m.Msg(src, dst, type_, 0, version, [m.int_frame(tuple(ints)), *frames])


def answered(msg, per):
    """[(param id, [(offset, frames)])] of a gathered answer with `per` frames per slice (None:
    as many as the frames divide into, the same for every slice)."""
    if not msg.frames:
        raise ClusterError("answer without frames")
    rest = msg.frames[1:]
    return [(pid, [(o, rest[a:b]) for o, a, b in slices])
            for pid, slices in _layout(m.parse_int_frame(msg.frames[0]), len(rest), per)]


@functools.lru_cache(maxsize=256)
def _layout(ints, nframes, per):
    """[(param id, [(offset, first frame, frame after)])] of a gathered answer's int frame
    `ints` and `nframes` frames (`answered`'s; a worker's answers have the same every step)."""
    params, k = [], 0
    while k < len(ints):
        if k + 2 > len(ints) or ints[k + 1] < 1 or k + 2 + ints[k + 1] > len(ints):
            raise ClusterError("malformed answer: its offsets are cut short")
        params.append((ints[k], ints[k + 2:k + 2 + ints[k + 1]]))
        k += 2 + ints[k + 1]
    nslices = sum(len(offsets) for _, offsets in params)
    if per is None and nslices:
        per = nframes // nslices
    if not params or per < 1 or nframes != per * nslices:
        raise ClusterError(f"malformed answer: {nframes} frames for {nslices} slices")
    out, f = [], 0
    for pid, offsets in params:
        out.append((pid, tuple((o, f + i * per, f + (i + 1) * per)
                               for i, o in enumerate(offsets))))
        f += per * len(offsets)
    return tuple(out)


def _place(out, o, frame, what):
    """Copy a slice's values into `out` at offset `o` (nothing when the frame aliases it)."""
    values = m.frame_array(frame)
    if not 0 <= o <= out.size - values.size:
        raise ClusterError(f"values for {what} out of its bounds")
    if not m.same_memory(values, out[o:] if o else out):
        assign(out[o:o + values.size], values)


def read_values(slices, flat, what):
    """Write the values of a param's answered kRGet / kRUpdate `slices` into `flat` (the
    param's flat array)."""
    for o, (frame,) in slices:
        _place(flat, o, frame, what)


def read_put_reply(slices):
    """(updater buffers the servers keep, whether some slice dropped the Put's) of a param's
    answered kRPut `slices`."""
    replies = [m.parse_format_frame("ii", frame) for _, (frame,) in slices]
    return max(n for n, _ in replies), any(dropped for _, dropped in replies)


def read_state(slices, shape, what):
    """(lr_index, [updater buffers shaped `shape`]) of a param's answered kRState `slices`."""
    size = int(np.prod(shape))
    bufs = [np.empty(size, np.float32) for _ in range(len(slices[0][1]) - 1)]
    lr_index = 0
    for o, frames in slices:
        (lr_index,) = m.parse_format_frame("i", frames[0])
        for buf, frame in zip(bufs, frames[1:]):
            _place(buf, o, frame, what)
    return lr_index, [b.reshape(shape) for b in bufs]
