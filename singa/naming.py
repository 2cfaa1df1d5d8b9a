"""Names: the unrolled names of a net's layers and params (`0#w1`), and in the Python API
(SINGA 0.3's tool/python/singa/utils) generated layer and param names, proto fields set by
keyword, enum values looked up by name.

`generate_name` keeps SINGA's two global counters, so a SINGA script names its layers and
params as SINGA's helper did (`layer1`, `w1`, `tanh1`, `conv2`, ...); `reset_names` restarts
them. A model (`singa.model.Model`) restarts them when it is constructed, so its generated
names depend on its own layers only, as in a fresh SINGA process: a notebook cell that builds
the model again names it as before, and `fit(resume=True)` finds its params in the snapshot. `enum<Type>(name)` exists for every enum of job.proto and common.proto: `name` is the
value's name without its first character, lower-cased (`enumLayerType('softmaxloss')` →
kSoftmaxLoss, `enumAlgType('bp')` → kBP, `enumPhase('train')` → kTrain).
"""
from google.protobuf.descriptor import FieldDescriptor

from singa.errors import ConfigError
from singa.proto import common_pb2, job_pb2

LAYERID = 0
PARAMID = 0


def unrolled(name, index=0):
    """`<index>#<name>`: layer or param `name` in copy `index` of its unrolled net (SINGA's
    NeuralNet::Unrolling). Every net is unrolled, so a plain net's param `w1` is `0#w1`, the
    name its checkpoints store."""
    return f"{index}#{name}"


def is_unrolled(name):
    """Whether `name` has the prefix `<index>#` of `unrolled` (SINGA 0.1's names have none)."""
    return "#" in name


def plain(name):
    """`name` without the prefix of `unrolled`: `0#w1` → `w1` (a name without one as it is)."""
    return name.partition("#")[2] or name


def generate_name(label, option=0, withnumber=True):
    """`<label><n>` (just `label` unless `withnumber`), SINGA's rule: n is the layer counter,
    the param counter for label 'param'; option 1 first advances that counter; option 2 gives
    the next layer's number without advancing."""
    global LAYERID, PARAMID
    if label == 'param':
        if option == 1:
            PARAMID += 1
        num = PARAMID
    else:
        if option == 1:
            LAYERID += 1
        num = LAYERID + 1 if option == 2 else LAYERID
    return f'{label}{num}' if withnumber else label


def reset_names():
    """Restart both counters (a fresh script's names)."""
    global LAYERID, PARAMID
    LAYERID = PARAMID = 0


def setval(proto, **kwargs):
    """Set `proto`'s fields by keyword: a message field merges the value, a repeated field
    appends it (each item of a list or tuple). Keywords that are no field of `proto` are
    skipped: SINGA's builders hand one set of keywords to several protos. A value the field
    cannot hold (1.5 for an int, 2^40 for an int32) is a ConfigError naming both."""
    fields = proto.DESCRIPTOR.fields_by_name
    for key, val in kwargs.items():
        field = fields.get(key)
        if field is None:
            continue
        attr = getattr(proto, key)
        message = field.type == FieldDescriptor.TYPE_MESSAGE
        try:
            if field.is_repeated:
                if message:
                    attr.add().MergeFrom(val)
                else:
                    attr.extend(val if isinstance(val, (list, tuple)) else [val])
            elif message:
                attr.MergeFrom(val)
            else:
                setattr(proto, key, val)
        except (TypeError, ValueError) as e:
            shown = " ".join(repr(val).split())
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise ConfigError(f"{key} {shown}: not a value of {proto.DESCRIPTOR.name}.{key} "
                              f"({e})") from None


def _enum_lookup(enum):
    values = {name[1:].lower(): number for name, number in enum.items()}

    def lookup(name):
        if name not in values:
            raise ConfigError(f"{enum.DESCRIPTOR.name} has no value '{name}' "
                              f"(known: {', '.join(sorted(values))})")
        return values[name]
    lookup.__name__ = lookup.__qualname__ = f"enum{enum.DESCRIPTOR.name}"
    lookup.__doc__ = f"The {enum.DESCRIPTOR.name} value named `name` (its name minus the first " \
                     f"character, lower-cased)."
    return lookup


_ENUMS = {name: _enum_lookup(getattr(module, name))
          for module in (common_pb2, job_pb2) for name in module.DESCRIPTOR.enum_types_by_name}
globals().update({f"enum{name}": fn for name, fn in _ENUMS.items()})

__all__ = ["generate_name", "reset_names", "setval"] + [f"enum{name}" for name in _ENUMS]
