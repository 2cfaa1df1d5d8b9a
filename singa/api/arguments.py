"""The Python API builders' arguments: the checks of what a builder is given, and Keras'
spellings of SINGA's arguments (kernel_size, padding, strides, input_shape, the initializers)
turned into SINGA's (docs/python.md). `singa.layer`'s builders call them."""
import inspect
import math
import numbers

from singa.errors import ConfigError
from singa.naming import setval
from singa.parameter import Parameter
from singa.proto import job_pb2

#: Keras' initializers that are fixed distributions, as ParamGenProto fields
FIXED_INITIALIZERS = {
    'zeros': dict(type=job_pb2.kConstant, value=0),
    'ones': dict(type=job_pb2.kConstant, value=1),
    'random_normal': dict(type=job_pb2.kGaussian, mean=0, std=0.05),
    'random_uniform': dict(type=job_pb2.kUniform, low=-0.05, high=0.05),
}
#: Keras' variance-scaling initializers: name -> (s, n, distribution): std sqrt(s/n), or
#: U(±sqrt(3s/n)), n = fan_in or fan_avg = (fan_in + fan_out)/2 (Keras' normal ones are
#: truncated, then rescaled to that std; ours draw a plain normal of that std)
SCALED_INITIALIZERS = {
    'glorot_uniform': (1, 'fan_avg', 'uniform'), 'glorot_normal': (1, 'fan_avg', 'normal'),
    'he_uniform': (2, 'fan_in', 'uniform'), 'he_normal': (2, 'fan_in', 'normal'),
    'lecun_uniform': (1, 'fan_in', 'uniform'), 'lecun_normal': (1, 'fan_in', 'normal'),
}
#: (n, distribution) -> (the engine's init type drawing it from the param's shape (rows, cols)
#: = (fan_out, fan_in), m): with ±sqrt(m·s) (uniform) or std sqrt(m·s) (normal) it draws the
#: formula above (singa.layers.param.fill); fan_avg normal has none
FAN_INITS = {('fan_in', 'normal'): (job_pb2.kGaussianSqrtFanIn, 1),
             ('fan_in', 'uniform'): (job_pb2.kUniformSqrtFanIn, 1),
             ('fan_avg', 'uniform'): (job_pb2.kUniformSqrtFanInOut, 6)}

LAYER_FIELDS = frozenset(job_pb2.LayerProto.DESCRIPTOR.fields_by_name)
INIT_FIELDS = tuple(job_pb2.ParamGenProto.DESCRIPTOR.fields_by_name)


def check_keywords(builder, kwargs):
    """ConfigError naming the first of `kwargs` that the Layer `builder` does not take
    (setval and set_param_field would skip it without a word)."""
    for key in kwargs:
        role, _, field = key.partition('_')
        if key in LAYER_FIELDS or key in ('seed', 'src') or key in builder.keywords or (
                role in ('w', 'b') and field in ('lr', 'wd') + INIT_FIELDS):
            continue
        params = inspect.signature(type(builder).__init__).parameters.values()
        own = [p.name for p in params if p.name not in ('self', 'input_shape')
               and p.kind not in (p.VAR_KEYWORD, p.POSITIONAL_ONLY)]
        raise ConfigError(f"{type(builder).__name__}: unknown keyword {key!r} (known: "
                          f"{', '.join(own + list(builder.keywords) + ['input_shape'])}, seed, "
                          f"src, w_/b_<lr|wd|{'|'.join(INIT_FIELDS)}>, LayerProto fields)")


def alias(builder, name, value, keras_name, keras_value, default=None):
    """SINGA's argument `name` or Keras' spelling `keras_name` of it, whichever is given (not
    None): both is a ConfigError; neither gives `default`."""
    if keras_value is None:
        return default if value is None else value
    if value is not None:
        raise ConfigError(f"{builder}: give {name} or {keras_name}, not both")
    return keras_value


def yx(value):
    """Keras' (rows, cols) as SINGA's pair (x, y); anything else as it is."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return (value[1], value[0])
    return value


def keras_pad(builder, padding, kernel):
    """Keras' `padding` as SINGA's pad for `kernel` (int or (x, y)): 'valid' 0, 'same' k//2
    on each axis (odd k: the output is ceil(size/stride) as Keras'); None for None."""
    if padding is None or padding == 'valid':
        return None if padding is None else 0
    if padding != 'same':
        raise ConfigError(f"{builder}: padding must be 'valid' or 'same', got {padding!r}")
    pair = (kernel, kernel) if isinstance(kernel, numbers.Integral) else kernel
    if any(k % 2 == 0 for k in pair):
        raise ConfigError(f"{builder}: padding 'same' needs an odd kernel (SINGA pads both "
                          f"sides alike; Keras pads an even one unequally), got {kernel!r}")
    return kernel // 2 if isinstance(kernel, numbers.Integral) else (pair[0] // 2, pair[1] // 2)


def sample_shape(builder, arg, value):
    """`value` (an int or a sequence of positive ints) as a tuple."""
    shape = (value,) if isinstance(value, numbers.Integral) else value
    if not (isinstance(shape, (tuple, list)) and shape
            and all(isinstance(d, numbers.Integral) and d > 0 for d in shape)):
        raise ConfigError(f"{builder}: {arg} must be a tuple of positive ints (a sample's "
                          f"shape, e.g. (784,)), got {value!r}")
    return tuple(int(d) for d in shape)


def keras_param(builder, arg, name, fans=None, exact=None):
    """A Parameter drawn as Keras' initializer `name` (None: None) for `arg`: FIXED_INITIALIZERS'
    fields, or (a weight's: `exact` not None) a SCALED_INITIALIZERS formula by FAN_INITS' init
    type where it is among `exact` (the types exact for this param's shape), else by bounds
    from `fans` (fan_in, fan_out; None where unknown: a ConfigError)."""
    if name is None:
        return None
    par = Parameter(init='none')
    if name in FIXED_INITIALIZERS:
        setval(par.param.init, **FIXED_INITIALIZERS[name])
        return par
    if name not in SCALED_INITIALIZERS or exact is None:
        known = list(FIXED_INITIALIZERS) + (list(SCALED_INITIALIZERS) if exact is not None else [])
        raise ConfigError(f"{builder}: {arg} must be one of {', '.join(known)}, got {name!r}")
    s, n, distribution = SCALED_INITIALIZERS[name]
    init_type, m = FAN_INITS.get((n, distribution), (None, 0))
    if init_type in exact:
        a = math.sqrt(m * s)
        fields = dict(mean=0, std=a) if distribution == 'normal' else dict(low=-a, high=a)
        setval(par.param.init, type=init_type, **fields)
        return par
    if fans is None:
        raise ConfigError(f"{builder}: {arg} {name!r} needs the layer's fan_in and fan_out: give "
                          f"input_shape (the shape of the samples it reads)")
    count = fans[0] if n == 'fan_in' else (fans[0] + fans[1]) / 2
    if distribution == 'normal':
        setval(par.param.init, type=job_pb2.kGaussian, mean=0, std=math.sqrt(s / count))
    else:
        a = math.sqrt(3 * s / count)
        setval(par.param.init, type=job_pb2.kUniform, low=-a, high=a)
    return par


def check_positive(builder, arg, value):
    """ConfigError unless `value` is a positive int."""
    if not isinstance(value, numbers.Integral) or value <= 0:
        raise ConfigError(f"{builder}: {arg} must be a positive int, got {value!r}")


def dims(builder, arg, value):
    """`value` (a positive int or a list of them) as a list."""
    found = [value] if isinstance(value, numbers.Integral) else list(value or [])
    if not found or not all(isinstance(d, numbers.Integral) and d > 0 for d in found):
        raise ConfigError(f"{builder}: {arg} must be a positive int or a list of them, "
                          f"got {value!r}")
    return found


def set_xy(conf, field, value, low=1):
    """`field` from an int, or `field_x` and `field_y` from a pair (ConvolutionProto)."""
    pair = (value, value) if isinstance(value, numbers.Integral) else value
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2
            and all(isinstance(v, numbers.Integral) and v >= low for v in pair)):
        raise ConfigError(f"Convolution2D: {field} must be an int >= {low} or a pair of them, "
                          f"got {value!r}")
    if isinstance(value, numbers.Integral):
        setattr(conf, field, value)
    else:
        setattr(conf, field + '_x', value[0])
        setattr(conf, field + '_y', value[1])
