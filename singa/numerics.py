"""Non-finite values in training: the loss is checked every step, params before a snapshot.

Cheap on the hot path: a step looks at one float per loss layer; arrays are scanned only when
a loss is nan or inf (to name where it started) and when a snapshot is about to be written.
"""
import math

import numpy as np

from singa.errors import NonFiniteError


def check_loss(net, step):
    """NonFiniteError if a metric a layer sums between displays (a loss, RBMVis's squared
    error) is nan or inf, naming the first layer (in forward order) whose params or output hold
    such values."""
    for layer in net.layers:
        for name, value in layer.metric_sums.items():
            if not math.isfinite(value):
                raise NonFiniteError(f"step {step}: the {name.lower()} of layer '{layer.name}' "
                                     f"is {value}; {first_non_finite(net)}")


def check_params(params, step):
    """NonFiniteError naming the first of `params` that holds nan or inf."""
    for p in params:
        if not np.isfinite(p.data).all():
            raise NonFiniteError(f"step {step}: param '{p.name}' holds nan or inf; no snapshot "
                                 f"written")


def first_non_finite(net):
    """Where nan or inf first appears in a forward pass of `net`: a param or a layer output."""
    for layer in net.layers:
        for p in layer.params:
            if not np.isfinite(p.data).all():
                return f"the first non-finite values are in param '{p.name}' of layer '{layer.name}'"
        data = layer.data
        if isinstance(data, np.ndarray) and data.dtype.kind == "f" and not np.isfinite(data).all():
            return f"the first non-finite values are in the output of layer '{layer.name}'"
    return "every param and layer output is finite"
