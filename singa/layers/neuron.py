"""Neuron layers other than convolution and normalisation: InnerProduct, activations, Dropout, Softmax, Dummy (src/neuralnet/neuron_layer/)."""
import math

import numpy as np

from singa.device import assign
from singa.device import threads
from singa.errors import ConfigError
from singa.layers import kernels
from singa.layers.base import Layer, make_params, register
from singa.layers.ops import softmax
from singa.layers.param import cut
from singa.proto import job_pb2

__all__ = ["InnerProductLayer", "ReLULayer", "SigmoidLayer", "STanhLayer", "ActivationLayer",
           "DropoutLayer", "SoftmaxLayer", "DummyLayer", "partitioned", "mark_pieces"]

# SINGA's scaled tanh constants (mshadow op::stanh).
STANH_A = np.float32(1.7159047)
STANH_B = np.float32(0.66666667)


def partitioned(layer, n, what="num_output"):
    """This partition's share of `n` when the layer is partitioned on dim 1 (model partition);
    ConfigError when `n` leaves a partition without any."""
    conf = layer.conf
    if conf.partition_dim > 0:
        if 0 < n < conf.num_partitions:
            raise ConfigError(f"layer '{layer.name}': {what} {n} cannot be cut over "
                              f"{conf.num_partitions} workers (partition_dim 1): each needs at "
                              f"least one")
        start, stop = cut(n, conf.num_partitions, conf.partition_id)
        return stop - start
    return n


def mark_pieces(layer, axes):
    """On partition_dim 1 over several partitions, each param {param: axis} is piece
    `partition_id` of the whole cut on `axis` (`Param.partition`)."""
    conf = layer.conf
    if conf.partition_dim > 0 and conf.num_partitions > 1:
        for p, axis in axes.items():
            p.partition = (axis, conf.partition_id, conf.num_partitions)


@register(job_pb2.kInnerProduct)
class InnerProductLayer(Layer):
    """y = x·Wᵀ + b (y = x·W with transpose); gW = gᵀ·x (xᵀ·g); gb = Σ_n g; gx = g·W (g·Wᵀ).

    x is the source flattened to (N, D); W is (M, D), or (D, M) with transpose. Without
    `bias_term` (SINGA ignored the field; Keras' use_bias=False) there is no b: y = x·Wᵀ and the
    conf lists W alone. On partition_dim 1 this partition computes its rows of M: W and b are
    pieces of the whole.
    """

    capturable = True

    feature_parts = True

    reads_all = True

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        n = src.shape[0]
        self.batchsize, self.vdim = n, src.size // n
        self.hdim = partitioned(self, self.conf.innerproduct_conf.num_output)
        self.transpose = self.conf.innerproduct_conf.transpose
        wshape = (self.vdim, self.hdim) if self.transpose else (self.hdim, self.vdim)
        shapes = {"weight": wshape}
        if self.conf.innerproduct_conf.bias_term:
            shapes["bias"] = (self.hdim,)
        self.params = make_params(self, shapes)
        self.weight, self.bias = (self.params + [None])[:2]
        mark_pieces(self, {p: axis for p, axis in zip(self.params, (int(self.transpose), 0))})
        self.data = self.xp.zeros((n, self.hdim), np.float32)
        self.grad = self.new_grad()

    def compute_feature(self, flag, srclayers):
        x = srclayers[0].data_for(self).reshape(self.batchsize, self.vdim)
        w = self.weight.data
        threads.matmul(x, w if self.transpose else w.T, self.data)
        if self.bias is not None:
            self.data += self.bias.data

    def compute_gradient(self, flag, srclayers):
        src = srclayers[0]
        x = src.data_for(self).reshape(self.batchsize, self.vdim)
        g, w = self.grad, self.weight.data
        if flag & job_pb2.kAggGrad:
            # BPTT: unrolled copies share one gradient, so each adds its part.
            if self.bias is not None:
                self.bias.grad += g.sum(axis=0)
            self.weight.grad += np.dot(x.T, g) if self.transpose else np.dot(g.T, x)
        else:
            if self.bias is not None:
                np.sum(g, axis=0, out=self.bias.grad)
            if self.transpose:
                threads.matmul(x.T, g, self.weight.grad)
            else:
                threads.matmul(g.T, x, self.weight.grad)
        gsrc = src.grad_for(self)
        if gsrc is not None:
            threads.matmul(g, w.T if self.transpose else w,
                           gsrc.reshape(self.batchsize, self.vdim))


class _Elementwise(Layer):
    """y = f(x) elementwise; gx = g·f', where f' is computed from y.

    `activation` is f as the kernels name it: (case, forward constants, backward constants)
    of `_ACTIVATIONS`. Both passes run by chunks of samples on the compute threads, each
    one call of the layer's kernels (`kernels.choose`): numpy's calls on the CPU, SINGA's
    activations one kernel each way on a GPU. gx may alias g (share_src_blobs).
    """

    feature_parts = True

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        self.kernels = kernels.choose(self.device)
        self.data = self.xp.zeros(src.shape, np.float32)
        self.grad = self.new_grad()

    def by_rows(self, flag, srclayers):
        x, y = srclayers[0].data_for(self), self.data
        case, consts, _ = self.activation
        return lambda rows: self.kernels.activation(case, x[rows], y[rows], *consts)

    def compute_feature(self, flag, srclayers):
        if not self.computed_ahead():
            threads.by_samples(self.by_rows(flag, srclayers), self.data)

    def compute_gradient(self, flag, srclayers):
        gsrc = srclayers[0].grad_for(self)
        if gsrc is None:
            return
        case, _, consts = self.activation
        threads.by_samples(lambda rows: self.kernels.activation_grad(
            case, self.data[rows], self.grad[rows], gsrc[rows], *consts), gsrc)


#: activation_conf.type → the kernels' case, with its constants (forward: y = a·tanh(b·x);
#: backward: f' = y²·a + b)
_ACTIVATIONS = {
    job_pb2.RELU: (kernels.RELU, (), ()),
    job_pb2.SIGMOID: (kernels.SIGMOID, (), ()),
    job_pb2.TANH: (kernels.TANH, (), ()),
    # SINGA 0.3 logs "Unknow activation type" for STANH; we compute it.
    job_pb2.STANH: (kernels.STANH, (STANH_A, STANH_B), (-STANH_B / STANH_A, STANH_A * STANH_B)),
}


@register(job_pb2.kReLU)
class ReLULayer(_Elementwise):
    """y = max(x, 0); gx = g·[y > 0] (relu_conf.negative_slope is ignored, as in SINGA)."""
    capturable = True
    activation = _ACTIVATIONS[job_pb2.RELU]


@register(job_pb2.kSigmoid)
class SigmoidLayer(_Elementwise):
    """y = 1/(1+e^{-x}); gx = g·y(1−y)."""
    capturable = True
    activation = _ACTIVATIONS[job_pb2.SIGMOID]


@register(job_pb2.kSTanh)
class STanhLayer(_Elementwise):
    """y = A·tanh(B·x) with A = 1.7159047, B = 0.66666667; gx = g·(A·B − (B/A)·y²)."""
    capturable = True
    activation = _ACTIVATIONS[job_pb2.STANH]


@register(job_pb2.kActivation, job_pb2.kCudnnActivation)
class ActivationLayer(_Elementwise):
    """y = f(x) for activation_conf.type RELU | SIGMOID | TANH | STANH.

    With share_src_blobs, data and grad alias the source's (computed in place).
    """

    capturable = True

    def setup(self, srclayers):
        self.activation = _ACTIVATIONS.get(self.conf.activation_conf.type)
        if self.activation is None:
            raise ConfigError(f"layer '{self.name}': unknown activation type "
                              f"{self.conf.activation_conf.type}")
        if self.conf.share_src_blobs:
            src = srclayers[0]
            self.kernels = kernels.choose(self.device)
            self.data, self.grad = src.data_for(self), src.grad_for(self)
        else:
            super().setup(srclayers)


@register(job_pb2.kDropout)
class DropoutLayer(Layer):
    """Train: mask = [u < 1−p]/(1−p), u ~ U[0,1) from `rng`; y = x·mask; gx = g·mask. Else y = x."""

    feature_parts = True

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        self.keep = np.float32(1 - self.conf.dropout_conf.dropout_ratio)
        self.data = self.xp.zeros(src.shape, np.float32)
        self.grad = self.new_grad()
        self.mask = np.ones_like(self.data)
        self._keep = self.xp.empty(src.shape, bool)

    def compute_feature(self, flag, srclayers):
        x = srclayers[0].data_for(self)
        if not flag & job_pb2.kTrain:
            np.copyto(self.data, x)
            return
        self.draw(self.mask)
        np.less(self.mask, self.keep, out=self._keep)
        np.multiply(self._keep, 1 / self.keep, out=self.mask)
        np.multiply(x, self.mask, out=self.data)

    def compute_gradient(self, flag, srclayers):
        gsrc = srclayers[0].grad_for(self)
        if gsrc is not None:
            np.multiply(self.grad, self.mask, out=gsrc)


@register(job_pb2.kSoftmax, job_pb2.kCudnnSoftmax)
class SoftmaxLayer(Layer):
    """y[n] = softmax(x[n]) row-wise over D = count/N. Forward only, like SINGA's.

    softmax_conf.axis a (ours, Caffe's): y = softmax over dim a at each position of the other
    dims (a = 1 of (N, C, H, W): over the channels at each pixel), x viewed as (outer, D_a,
    inner); gx = y·(g − Σ_a g·y) (Caffe's backward).
    """

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        self.data = self.xp.zeros(src.shape, np.float32)
        sc = self.conf.softmax_conf
        if not sc.HasField("axis"):
            self.view = None
            self._rowmax = self.xp.empty((src.shape[0], 1), np.float32)
            return
        if not -src.ndim <= sc.axis < src.ndim:
            raise ConfigError(f"layer '{self.name}': softmax_conf.axis {sc.axis} is out of "
                              f"range for a source of shape {src.shape}")
        a = sc.axis % src.ndim
        self.view = (math.prod(src.shape[:a]), src.shape[a], math.prod(src.shape[a + 1:]))
        self.grad = self.new_grad()
        self._rowmax = self.xp.empty((self.view[0], 1, self.view[2]), np.float32)

    def compute_feature(self, flag, srclayers):
        x = srclayers[0].data_for(self)
        if self.view is None:
            softmax(x.reshape(x.shape[0], -1), self.data.reshape(x.shape[0], -1), self._rowmax)
            return
        softmax(x.reshape(self.view), self.data.reshape(self.view), self._rowmax)

    def compute_gradient(self, flag, srclayers):
        if self.view is None:
            raise ConfigError(f"layer '{self.name}': SINGA's Softmax layer has no backward; "
                              f"use kSoftmaxLoss in training nets and kSoftmax only in test "
                              f"nets (or Caffe's, softmax_conf.axis)")
        gsrc = srclayers[0].grad_for(self)
        if gsrc is None:
            return
        y, g, m = self.data.reshape(self.view), self.grad.reshape(self.view), self._rowmax
        gy = np.multiply(g, y, out=gsrc.reshape(self.view))     # then gx overwrites it
        np.sum(gy, axis=1, keepdims=True, out=m)
        gx = gsrc.reshape(self.view)
        np.subtract(g, m, out=gx)
        gx *= y


@register(job_pb2.kDummy)
class DummyLayer(Layer):
    """A testing aid. dummy_conf.input: no source, data (shape) ~ U[0,1) from `rng` on every
    forward, or the batch last given to `feed`; otherwise data = the source's.
    dummy_conf.output: backward draws grad ~ U[0,1); then, with a source, gx = grad.
    """

    fed = False

    sources = (0, 1)     # which of the two, dummy_conf.input says

    def setup(self, srclayers):
        dc = self.conf.dummy_conf
        want = 0 if dc.input else 1
        if len(srclayers) != want:
            role = ("as input (dummy_conf.input) takes no srclayers" if dc.input
                    else "needs 1 srclayer")
            raise ConfigError(f"layer '{self.name}' {role}, got {len(srclayers)}")
        if dc.input:
            if not dc.shape or min(dc.shape) <= 0:
                raise ConfigError(f"layer '{self.name}': dummy_conf.shape must list positive "
                                  f"sizes, got {list(dc.shape)}")
            shape = tuple(dc.shape)
        else:
            shape = srclayers[0].data_for(self).shape
        self.data = self.xp.zeros(shape, np.float32)
        self.grad = self.new_grad()

    def compute_feature(self, flag, srclayers):
        if self.conf.dummy_conf.input:
            if not self.fed:
                self.draw(self.data)
        else:
            np.copyto(self.data, srclayers[0].data_for(self))

    def compute_gradient(self, flag, srclayers):
        if self.conf.dummy_conf.output:
            self.draw(self.grad)
        gsrc = srclayers[0].grad_for(self) if srclayers else None
        if gsrc is not None:
            np.copyto(gsrc, self.grad)

    def feed(self, data=None, aux_data=None):
        """SINGA's DummyLayer::Feed: copy `data` (any array of data's size) into data, and/or
        the integer labels `aux_data` (one per row of data) into aux_data."""
        if data is not None:
            data = np.asarray(data)
            if data.size != self.data.size:
                raise ConfigError(f"layer '{self.name}': fed data of shape {data.shape}, but "
                                  f"it holds {self.data.shape}")
            assign(self.data, data.reshape(self.data.shape))
            self.fed = True
        if aux_data is not None:
            labels = np.asarray(aux_data).reshape(-1)
            if len(labels) != len(self.data):
                raise ConfigError(f"layer '{self.name}': fed {len(labels)} labels for a batch "
                                  f"of {len(self.data)}")
            self.aux_data = labels.astype(np.int32)
