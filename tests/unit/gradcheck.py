"""Numeric gradient checker for layers (after Caffe's GradientChecker), plus test fixtures.

`check_gradients` compares what a layer's `compute_gradient` writes (into its sources' grad
blobs and its params' grads) with central differences of a scalar objective of its forward
pass, computed in float64 on the float32 layer.
"""
import numpy as np
from google.protobuf import text_format

from singa.layers.base import Layer, create_layer, set_up
from singa.proto import job_pb2

FORWARD = job_pb2.kTrain | job_pb2.kForward
BACKWARD = job_pb2.kTrain | job_pb2.kBackward


class Source(Layer):
    """A fixed blob feeding the layer under test: `data`, `grad` (None if not grad) and labels."""

    def __init__(self, data, labels=None, grad=True, name="src"):
        super().__init__(job_pb2.LayerProto(name=name))
        self.data = np.ascontiguousarray(data, np.float32)
        self.grad = np.zeros_like(self.data) if grad else None
        self.aux_data = None if labels is None else np.asarray(labels, np.int32)


def make_layer(conf_text, srclayers, seed=0, param_std=0.5):
    """The layer of text-format LayerProto `conf_text` set up on `srclayers`; params ~ N(0, std)."""
    conf = text_format.Parse(conf_text, job_pb2.LayerProto())
    layer = create_layer(conf)
    layer.rng = np.random.default_rng(seed)
    set_up(layer, srclayers)
    for p in layer.params:
        p.data[...] = layer.rng.normal(0, param_std, p.data.shape)
    return layer


def check_gradients(layer, srclayers, flag=FORWARD, objective=None, outputs=None, eps=1e-2,
                    rtol=1e-2, atol=1e-3, before_forward=None, seed=0):
    """Assert the layer's analytic gradients equal numeric ones; return how many were checked.

    L = objective() after `compute_feature(flag)`. By default L = Σ_k data_k·R_k over
    `outputs`, pairs (data_k, grad_k) of the layer's blobs (default: [(data, grad)]), with
    fixed random R_k written into grad_k as dL/d data_k before `compute_gradient`. Gradient
    blobs are filled with NaN first, so a layer that accumulates instead of writing fails.
    `before_forward` runs before every forward (e.g. to fix a Dropout mask).
    """
    rng = np.random.default_rng(seed)
    seeds = []
    if objective is None:
        outputs = outputs or [(layer.data, layer.grad)]
        seeds = [(g, rng.standard_normal(d.shape).astype(np.float32)) for d, g in outputs]

        def objective():
            return sum(float(np.dot(d.ravel().astype(np.float64), r.ravel()))
                       for (d, _), (_, r) in zip(outputs, seeds))

    def loss():
        if before_forward is not None:
            before_forward()
        layer.compute_feature(flag, srclayers)
        return objective()

    loss()
    for g, r in seeds:
        g[...] = r
    targets = [(f"source '{s.name}'", s.data, s.grad_for(layer)) for s in srclayers
               if s.grad_for(layer) is not None]
    targets += [(f"param '{p.name}'", p.data, p.grad) for p in layer.params]
    for _, _, g in targets:
        g[...] = np.nan
    layer.compute_gradient(BACKWARD, srclayers)
    checked = 0
    for what, x, g in targets:
        analytic = g.astype(np.float64)
        numeric = numeric_gradient(loss, x, eps)
        np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol,
                                   err_msg=f"{layer!r}: gradient of {what}")
        checked += x.size
    loss()  # leave the layer's outputs as they are for the unperturbed inputs
    return checked


def numeric_gradient(f, x, eps):
    """dF/dx by central differences, perturbing float32 array x in place (restored after)."""
    grad = np.zeros(x.shape, np.float64)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    assert np.shares_memory(flat, x)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + np.float32(eps)
        hi, fhi = float(flat[i]), f()
        flat[i] = old - np.float32(eps)
        lo, flo = float(flat[i]), f()
        flat[i] = old
        gflat[i] = (fhi - flo) / (hi - lo)
    return grad
