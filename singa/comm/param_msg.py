"""Param messages: every message about a param is built and parsed here (SINGA's
Param::GenPutMsg / GenGetMsg / GenUpdateMsg and their Parse*, src/utils/param.cc).

`trgt_val` is (param id, slice id) (`msg.param_trgt`): a worker's request names its owner param
and slice 0, the stub's requests and the servers' answers one slice; `trgt_version` is the
version asked for or reached. Arrays travel as float32 frames (`msg.array_frame`): in-process
a frame is the sender's array (of the host or of a GPU), which must stay unchanged until read;
values that will change go as a host copy (`device.host_copy`).

  worker -> stub     kPut     [ffi: lr_scale, wd_scale, lr_index; values; updater buffers...]
                     kGet     []
                     kUpdate  [gradient]
                     kState   []
  stub -> server     kPut     [iffii: size, lr_scale, wd_scale, num_total, lr_index;
  (one per slice)              values; updater buffers...]
                     kGet     []
                     kUpdate  [i: num_local; the sum of the stub's num_local gradients]
                     kState   []
  server -> stub     kRPut [ii: updater buffers kept, 1 if the Put's were dropped],
                     kRGet [values], kRUpdate [values],
                     kRState [i: lr_index; a copy of each updater buffer]
  stub -> worker     the same answer once every slice has given it:
                     [offsets; each slice's frames, in slice order]
  server -> master   kSyncRequest [values - values at the last sync] (Distributed Hogwild)
  master -> server   kSyncResponse [the master's values after adding them]

lr_index -1 in a Put keeps the server's learning-rate position. Parsers raise ClusterError for
a message they did not build (it is dropped), never write outside the param.
"""
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


def update(src, dst, owner, version, grad):
    """A worker's Update: its gradient of param `owner`."""
    return m.Msg(src, dst, m.kUpdate, m.param_trgt(owner, 0), version, [m.array_frame(grad)])


def parse_update(msg, size):
    """The gradient of a worker's Update."""
    if len(msg.frames) != 1:
        raise ClusterError("Update without a gradient")
    return m.frame_array(msg.frames[0], size)


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


def slice_update(src, server, owner, sid, version, num_local, grad):
    """The Update of one slice: the sum of `num_local` shares' gradients."""
    return m.Msg(src, server, m.kUpdate, m.param_trgt(owner, sid), version,
                 [m.int_frame((num_local,)), m.array_frame(grad)])


def parse_slice_update(msg, size):
    """(num_local, gradient) of a slice's Update."""
    if len(msg.frames) != 2:
        raise ClusterError(f"Update of slice {m.slice_id(msg.trgt_val)} without a gradient")
    counts = m.parse_int_frame(msg.frames[0])
    if len(counts) != 1:
        raise ClusterError(f"malformed Update of slice {m.slice_id(msg.trgt_val)}")
    return counts[0], m.frame_array(msg.frames[1], size)


# --- server -> stub ----------------------------------------------------------------------
def put_reply(req, version, nbuffers, dropped):
    """kRPut to `req`: the slice keeps `nbuffers` updater buffers; `dropped`: not the Put's
    (another updater's, of a snapshot), so its state starts afresh."""
    return req.reply(m.kRPut, version, [m.format_frame("ii", nbuffers, int(dropped))])


def values_reply(req, type_, version, values):
    """kRGet / kRUpdate to `req`: the slice's values (aliased in-process: unchanged until read)."""
    return req.reply(type_, version, [m.array_frame(values)])


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


# --- stub -> worker ----------------------------------------------------------------------
def gathered(src, dst, type_, param_id, version, offsets, answers):
    """One answer of every slice (`answers[k]`: slice k's frames, which starts at `offsets[k]`)
    as one message to the share `param_id` of worker `dst`."""
    frames = [m.int_frame(tuple(offsets))] + [f for frames in answers for f in frames]
    return m.Msg(src, dst, type_, m.param_trgt(param_id, 0), version, frames)


def _slices(msg, per, what):
    """[(offset, frames)] of a gathered answer with `per` frames per slice (None: as many as
    the frames divide into)."""
    if not msg.frames:
        raise ClusterError(f"answer for {what} without frames")
    offsets = m.parse_int_frame(msg.frames[0])
    rest = msg.frames[1:]
    if per is None:
        per = len(rest) // max(1, len(offsets))
    if per < 1 or len(rest) != per * len(offsets):
        raise ClusterError(f"malformed answer for {what}: {len(rest)} frames for "
                           f"{len(offsets)} slices")
    return [(o, rest[k * per:(k + 1) * per]) for k, o in enumerate(offsets)]


def _place(out, o, frame, what):
    """Copy a slice's values into `out` at offset `o` (nothing when the frame aliases it)."""
    values = m.frame_array(frame)
    if not 0 <= o <= out.size - values.size:
        raise ClusterError(f"values for {what} out of its bounds")
    if not m.same_memory(values, out[o:] if o else out):
        assign(out[o:o + values.size], values)


def read_values(msg, flat, what):
    """Write the values of a gathered kRGet / kRUpdate into `flat` (a param's flat array)."""
    for o, (frame,) in _slices(msg, 1, what):
        _place(flat, o, frame, what)


def read_put_reply(msg, what):
    """(updater buffers the servers keep, whether some slice dropped the Put's) of a gathered
    kRPut."""
    replies = [m.parse_format_frame("ii", frame) for _, (frame,) in _slices(msg, 1, what)]
    return max(n for n, _ in replies), any(dropped for _, dropped in replies)


def read_state(msg, shape, what):
    """(lr_index, [updater buffers shaped `shape`]) of a gathered kRState."""
    parts = _slices(msg, None, what)
    size = int(np.prod(shape))
    bufs = [np.empty(size, np.float32) for _ in range(len(parts[0][1]) - 1)] if parts else []
    lr_index = 0
    for o, frames in parts:
        (lr_index,) = m.parse_format_frame("i", frames[0])
        for buf, frame in zip(bufs, frames[1:]):
            _place(buf, o, frame, what)
    return lr_index, [b.reshape(shape) for b in bufs]
