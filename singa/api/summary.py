"""Keras' model.summary() for a NetProto: each layer's output shape per sample and param count,
learnt by setting the net up on SHAPES (nothing is allocated)."""
import math

import numpy as np

from singa.device.footprint import SHAPES
from singa.layers.base import type_name
from singa.naming import plain
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2

__all__ = ["summary_lines"]

COLUMNS = (32, 24, 12)


def summary_lines(net_proto):
    """Lines of a table of the train net of `net_proto`'s layers (not the Split layers the net
    adds): name (type), output shape per sample (the data's shape less its batch axis; '-' for
    a layer whose destinations read parts), params (the values it owns: a shared param counts
    at its owner); then the totals, params updated by the layer itself (BatchNorm's running
    sums) as non-trainable."""
    net = NeuralNet(net_proto, job_pb2.kTrain, np.random.default_rng(0), device=SHAPES)
    named = {ly.name for ly in net_proto.layer}
    lines = [_row("Layer (type)", "Output shape", "Params"), "=" * sum(COLUMNS)]
    total = fixed = 0
    for layer in net.layers:
        name = plain(layer.name)
        if name not in named:
            continue
        owned = [p for p in layer.params if p.is_owner]
        count = sum(math.prod(p.shape) for p in owned)
        fixed += sum(math.prod(p.shape) for p in owned if p.updated_by_layer)
        total += count
        data = getattr(layer, "data", None)
        shape = "-" if data is None else str(tuple(data.shape[1:]))
        lines.append(_row(f"{name} ({type_name(layer.conf)[1:]})", shape, f"{count:,}"))
    lines += ["=" * sum(COLUMNS), f"Total params: {total:,}",
              f"Trainable params: {total - fixed:,}", f"Non-trainable params: {fixed:,}"]
    return lines


def _row(*cells):
    return "".join(str(c).ljust(w) for c, w in zip(cells, COLUMNS)).rstrip()
