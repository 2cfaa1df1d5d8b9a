"""Default field values of the Python API's builders (SINGA 0.3's tool/python/singa/initializations.py)."""
from singa.errors import ConfigError

#: identifier -> {field: default}; 'uniform' takes ±scale (default 0.05) instead
_DEFAULTS = {
    'constant': {'value': 0},
    'gaussian': {'mean': 0, 'std': 0.01},
    'conv2d': {'stride': 1, 'pad': 0},
    'lrn2d': {'alpha': 1, 'beta': 0.75, 'knorm': 1},
    'dropout': {'ratio': 0.5},
}


def get_init_values(identifier, **kwargs):
    """{field: value} for `identifier`: each default unless `kwargs` gives the field; None for
    'none'. 'uniform': low = -scale, high = scale (scale 0.05 unless given)."""
    if identifier == 'none':
        return None
    if identifier == 'uniform':
        scale = kwargs.get('scale', 0.05)
        defaults = {'low': -scale, 'high': scale}
    elif identifier in _DEFAULTS:
        defaults = _DEFAULTS[identifier]
    else:
        known = ", ".join(["none", "uniform", *_DEFAULTS])
        raise ConfigError(f"get_init_values: identifier must be one of {known}, "
                          f"got {identifier!r}")
    return {name: kwargs.get(name, value) for name, value in defaults.items()}
