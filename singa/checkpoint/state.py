"""Our extra state in a snapshot file: updater buffers, RNG and reader positions, LR index, step.

It lives in BlobProtos fields 300-308, which SINGA ignores; `encode` and `decode` convert
between a SnapshotState and those fields (the buffers' values are framed by `format`).
"""
import dataclasses

from singa.errors import CheckpointError

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
    rng: dict = dataclasses.field(default_factory=dict)          # name -> PCG64 bit_generator.state
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
    for name, st in state.rng.items():
        msg.rng.add(name=name, bit_generator=st["bit_generator"],
                    state=st["state"]["state"].to_bytes(16, "little"),
                    inc=st["state"]["inc"].to_bytes(16, "little"),
                    has_uint32=st["has_uint32"], uinteger=st["uinteger"])
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
    for r in msg.rng:
        state.rng[r.name] = {"bit_generator": r.bit_generator,
                             "state": {"state": int.from_bytes(r.state, "little"),
                                       "inc": int.from_bytes(r.inc, "little")},
                             "has_uint32": r.has_uint32, "uinteger": r.uinteger}
    state.reader = {r.name: (r.offset, r.skipped) for r in msg.reader}
    return state


def check(path, msg, shapes, buffer_shapes):
    """Updater buffers have the shape of a param of the file; RNG states are numpy's PCG64.

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
        if r.bit_generator != "PCG64":
            raise CheckpointError(f"checkpoint {path}: RNG state of {r.name} is for "
                                  f"{r.bit_generator!r}, not PCG64")
        if len(r.state) != 16 or len(r.inc) != 16 or r.has_uint32 not in (0, 1):
            raise CheckpointError(f"checkpoint {path}: RNG state of {r.name} is not a PCG64 "
                                  f"state (128-bit state and increment, has_uint32 0 or 1)")
