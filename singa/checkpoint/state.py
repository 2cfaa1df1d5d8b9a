"""Our extra state in a snapshot file: updater buffers, RNG and reader positions, LR index, step.

It lives in BlobProtos fields 300-308, which SINGA ignores; `encode` and `decode` convert
between a SnapshotState and those fields (the buffers' values are framed by `format`).
"""
import dataclasses

from singa.errors import CheckpointError
from singa.net.numerics import rng_state_problem

#: The BlobProtos fields of a SnapshotState: a file holding any of them must have a checksum.
FIELDS = ("step", "param_state", "rng", "reader", "lr_index", "nworkers", "metric_name",
          "metric_value", "evaluated")


@dataclasses.dataclass
class SnapshotState:
    """What a bit-exact resume needs besides param values: all of it lives in our fields."""
    step: int = 0
    nworkers: int = 1
    lr_index: int = 0
    param_state: dict = dataclasses.field(default_factory=dict)  # name -> [updater buffers]
    rng: dict = dataclasses.field(default_factory=dict)          # name -> numerics.rng_state(rng)
    reader: dict = dataclasses.field(default_factory=dict)       # name -> (offset, skipped)
    metrics: dict = dataclasses.field(default_factory=dict)      # test metric -> value
    evaluated: bool = False     # the step's test/validation ran before the snapshot was taken


def encode(state, msg):
    """Set `msg`'s fields 300 and 302-308 from `state`; returns the updater buffers of field
    301 as [(name, [arrays])], left to the writer to frame."""
    msg.step = state.step
    msg.nworkers = state.nworkers
    msg.lr_index = state.lr_index
    if state.evaluated:
        msg.evaluated = True
    for name, fields in state.rng.items():
        msg.rng.add(name=name, **fields)
    for name, (offset, skipped) in state.reader.items():
        msg.reader.add(name=name, offset=offset, skipped=skipped)
    for name, value in state.metrics.items():
        msg.metric_name.append(name)
        msg.metric_value.append(value)
    return list(state.param_state.items())


def decode(msg, param_state):
    """The SnapshotState of `msg`; `param_state` = {name: [arrays]} of its field 301."""
    state = SnapshotState(step=msg.step, nworkers=msg.nworkers if msg.HasField("nworkers") else 1,
                          lr_index=msg.lr_index, evaluated=msg.evaluated,
                          metrics=dict(zip(msg.metric_name, msg.metric_value)),
                          param_state=param_state)
    state.rng = {r.name: _rng_fields(r) for r in msg.rng}
    state.reader = {r.name: (r.offset, r.skipped) for r in msg.reader}
    return state


def check(path, msg, shapes, buffer_shapes):
    """Updater buffers have the shape of a param of the file; RNG states are ones
    `numerics.rng_state` gives.

    `shapes`: {param name: shape}; `buffer_shapes`: [(name, [shape of each buffer])]."""
    for name, bufs in buffer_shapes:
        if not isinstance(name, str):
            raise CheckpointError(f"checkpoint {path}: updater state name {name!r} is not UTF-8 text")
        if bufs and name not in shapes:
            raise CheckpointError(f"checkpoint {path}: updater state of {name}, a param the "
                                  f"file does not hold")
        for i, shape in enumerate(bufs):
            if shape != shapes[name]:
                raise CheckpointError(f"checkpoint {path}: updater state {i} of {name} has "
                                      f"shape {shape}, the param {shapes[name]}")
    for r in msg.rng:
        why = rng_state_problem(_rng_fields(r))
        if why is not None:
            raise CheckpointError(f"checkpoint {path}: RNG state of {r.name} {why}")


def _rng_fields(r):
    """The fields of RngState `r` but its name, as a dict."""
    return {f.name: getattr(r, f.name) for f in r.DESCRIPTOR.fields if f.name != "name"}
