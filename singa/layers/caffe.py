"""Caffe's layer kinds that SINGA has no counterpart of: Scale, Eltwise, Flatten, Crop (src/caffe/layers/scale_layer.cpp, eltwise_layer.cpp, flatten_layer.cpp, crop_layer.cpp).

Each computes on partition_dim 0 only (the conf check refuses dim 1).
"""
import math

import numpy as np

from singa.device import threads
from singa.errors import ConfigError
from singa.layers import kernels
from singa.layers.base import Layer, make_params, register
from singa.proto import job_pb2

__all__ = ["ScaleLayer", "EltwiseLayer", "FlattenLayer", "CropLayer"]


def _axis(layer, axis, ndim, what):
    """Caffe's CanonicalAxisIndex: `axis` in [−ndim, ndim) as a non-negative index."""
    if not -ndim <= axis < ndim:
        raise ConfigError(f"layer '{layer.name}': {what} {axis} is out of range for a source "
                          f"of {ndim} axes")
    return axis % ndim


def _write(p, value, flag):
    """A param's gradient: written, or added with kAggGrad (BPTT's unrolled copies)."""
    if flag & job_pb2.kAggGrad:
        p.grad += value.reshape(p.grad.shape)
    else:
        np.copyto(p.grad, value.reshape(p.grad.shape))


@register(job_pb2.kScale)
class ScaleLayer(Layer):
    """Caffe's Scale: y = x·γ (+ β), γ and β of shape x.shape[axis:axis + num_axes] broadcast
    over the other axes; gγ = Σ g·x, gβ = Σ g over those others; gx = g·γ.

    Params in conf order: γ, then β with bias_term. num_axes −1: to the last axis; 0: γ is
    one number (shape (1,)). One source (Caffe's second-source γ is not supported). The
    forward pass runs by chunks of samples on the compute threads, each one call of the
    kernels' `scale`.
    """

    capturable = True

    sources = (1, 1)

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        sc = self.conf.scale_conf
        axis = _axis(self, sc.axis, src.ndim, "scale_conf.axis")
        end = src.ndim if sc.num_axes == -1 else axis + sc.num_axes
        if sc.num_axes < -1 or end > src.ndim:
            raise ConfigError(f"layer '{self.name}': scale_conf.num_axes {sc.num_axes} from "
                              f"axis {axis} does not fit a source of shape {src.shape}")
        shape = src.shape[axis:end]
        self.view = (1,) * axis + shape + (1,) * (src.ndim - end)
        self.others = tuple(range(axis)) + tuple(range(end, src.ndim))
        self.inner = int(np.prod(src.shape[end:], dtype=np.int64))     # after γ's axes
        self.kernels = kernels.choose(self.device)
        roles = {"scale": shape or (1,)}
        if sc.bias_term:
            roles["bias"] = shape or (1,)
        self.params = make_params(self, roles)
        self.data = self.xp.zeros(src.shape, np.float32)
        self.grad = self.new_grad()
        self._tmp = None        # g·x where no source's gradient blob holds it, made once

    def by_rows(self, flag, srclayers):
        x = srclayers[0].data_for(self)
        return lambda rows: self._scale(x, rows)

    def compute_feature(self, flag, srclayers):
        if not self.computed_ahead():
            threads.by_samples(self.by_rows(flag, srclayers), self.data)

    def _scale(self, x, rows):
        """Samples `rows` of y = x·γ (+ β): one call of the kernels' `scale`, x as (the axes
        before γ's, γ's, those after)."""
        def per(p):     # γ or β for these samples, flat: all of it unless it spans dim 0
            v = p.data.reshape(self.view)
            return (v[rows] if self.view[0] > 1 else v).reshape(-1)
        gamma = per(self.params[0])
        beta = per(self.params[1]) if len(self.params) > 1 else None
        shape = (-1, gamma.size, self.inner)
        self.kernels.scale(x[rows].reshape(shape), gamma, beta, self.data[rows].reshape(shape))

    def compute_gradient(self, flag, srclayers):
        g, src = self.grad, srclayers[0]
        gsrc = src.grad_for(self)
        if gsrc is None and self._tmp is None:
            self._tmp = np.empty_like(self.data)
        # g·x in the source's gradient blob, which g·γ then overwrites
        gxy = np.multiply(g, src.data_for(self), out=self._tmp if gsrc is None else gsrc)
        _write(self.params[0], gxy.sum(axis=self.others), flag)
        if len(self.params) > 1:
            _write(self.params[1], g.sum(axis=self.others), flag)
        if gsrc is not None:
            np.multiply(g, self.params[0].data.reshape(self.view), out=gsrc)


@register(job_pb2.kEltwise)
class EltwiseLayer(Layer):
    """Caffe's Eltwise over sources x_1..x_n (n ≥ 2) of one shape:
    SUM: y = Σ c_i·x_i (c_i = eltwise_conf.coeff, all 1 if none), gx_i = c_i·g, the forward
    pass by chunks of samples on the compute threads;
    PROD: y = Π x_i, gx_i = g·Π_{j≠i} x_j (Caffe's stable_prod_grad);
    MAX: y = max_i x_i, g routed to the argmax that Caffe's loop keeps: x_2 wins a tie with
    x_1 (its first comparison is x_1 > x_2), a later source only when strictly greater.
    """

    capturable = True

    sources = (2, None)

    def setup(self, srclayers):
        ec = self.conf.eltwise_conf
        xs = [s.data_for(self) for s in srclayers]
        for s, x in zip(srclayers[1:], xs[1:]):
            if x.shape != xs[0].shape:
                raise ConfigError(f"layer '{self.name}': source '{s.name}' has shape {x.shape}, "
                                  f"'{srclayers[0].name}' {xs[0].shape}; Eltwise needs one shape")
        self.op = ec.operation
        if ec.coeff and (self.op != job_pb2.EltwiseProto.SUM or len(ec.coeff) != len(xs)):
            raise ConfigError(f"layer '{self.name}': eltwise_conf.coeff needs operation SUM and "
                              f"one value per source ({len(xs)}), got {len(ec.coeff)}")
        self.coeff = [np.float32(c) for c in ec.coeff] or [np.float32(1)] * len(xs)
        self.data = self.xp.zeros(xs[0].shape, np.float32)
        self.grad = self.new_grad()
        if self.op == job_pb2.EltwiseProto.MAX:
            self.argmax = self.xp.zeros(xs[0].shape, np.min_scalar_type(len(xs)))
            self._hit = self.xp.empty(xs[0].shape, bool)
        self._tmp = None        # c·x, made at its first use (SUM with a coefficient not 1)

    def compute_feature(self, flag, srclayers):
        xs = [s.data_for(self) for s in srclayers]
        y = self.data
        if self.op == job_pb2.EltwiseProto.SUM:
            if self._tmp is None and any(c != 1 for c in self.coeff[1:]):
                self._tmp = np.empty_like(self.data)
            threads.by_samples(lambda rows: self._sum([x[rows] for x in xs], rows), y)
        elif self.op == job_pb2.EltwiseProto.PROD:
            np.multiply(xs[0], xs[1], out=y)
            for x in xs[2:]:
                y *= x
        else:
            hit, am = self._hit, self.argmax
            np.greater(xs[0], xs[1], out=hit)
            np.logical_not(hit, out=hit)
            np.copyto(am, hit, casting="unsafe")
            np.maximum(xs[0], xs[1], out=y)
            for i, x in enumerate(xs[2:], 2):
                np.greater(x, y, out=hit)
                np.copyto(am, am.dtype.type(i), where=hit)
                np.maximum(y, x, out=y)

    def _sum(self, xs, rows):
        """Samples `rows` of y = Σ c_i·x_i, in source order."""
        y = self.data[rows]
        first = 2 if self.coeff[0] == self.coeff[1] == 1 else 1     # x·1 is x: same bits
        if first == 2:
            np.add(xs[0], xs[1], out=y)
        else:
            np.multiply(xs[0], self.coeff[0], out=y)
        for x, c in zip(xs[first:], self.coeff[first:]):
            y += np.multiply(x, c, out=self._tmp[rows]) if c != 1 else x

    def compute_gradient(self, flag, srclayers):
        g = self.grad
        for i, s in enumerate(srclayers):
            gsrc = s.grad_for(self)
            if gsrc is None:
                continue
            if self.op == job_pb2.EltwiseProto.SUM:
                np.multiply(g, self.coeff[i], out=gsrc)
            elif self.op == job_pb2.EltwiseProto.PROD:
                np.copyto(gsrc, g)
                for j, other in enumerate(srclayers):
                    if j != i:
                        gsrc *= other.data_for(self)
            else:
                np.equal(self.argmax, i, out=self._hit)
                np.multiply(g, self._hit, out=gsrc)


@register(job_pb2.kFlatten)
class FlattenLayer(Layer):
    """Caffe's Flatten: axes axis..end_axis of x merged into one, y = x reshaped
    (x.shape[:axis] + (Π x.shape[axis:end_axis+1],) + x.shape[end_axis+1:]); gx = g reshaped."""

    capturable = True

    sources = (1, 1)

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        fc = self.conf.flatten_conf
        a = _axis(self, fc.axis, src.ndim, "flatten_conf.axis")
        e = _axis(self, fc.end_axis, src.ndim, "flatten_conf.end_axis")
        if e < a:
            raise ConfigError(f"layer '{self.name}': flatten_conf.end_axis {fc.end_axis} comes "
                              f"before axis {fc.axis} in a source of shape {src.shape}")
        shape = src.shape[:a] + (math.prod(src.shape[a:e + 1]),) + src.shape[e + 1:]
        self.data = self.xp.zeros(shape, np.float32)
        self.grad = self.new_grad()

    def compute_feature(self, flag, srclayers):
        np.copyto(self.data, srclayers[0].data_for(self).reshape(self.data.shape))

    def compute_gradient(self, flag, srclayers):
        gsrc = srclayers[0].grad_for(self)
        if gsrc is not None:
            np.copyto(gsrc, self.grad.reshape(gsrc.shape))


@register(job_pb2.kCrop)
class CropLayer(Layer):
    """Caffe's Crop: y = x_1[..., o_a : o_a + s_a, ...] on every axis a ≥ axis, where s is
    the shape of source 2 (whose values are not read) and o the offsets (crop_conf.offset:
    one per cropped axis, one for all, or none: 0); the axes before `axis` are kept.
    gx_1 = g in the window, 0 elsewhere; source 2 gets a zero gradient."""

    capturable = True

    sources = (2, 2)

    def setup(self, srclayers):
        x, ref = (s.data_for(self) for s in srclayers)
        cc = self.conf.crop_conf
        if x.ndim != ref.ndim:
            raise ConfigError(f"layer '{self.name}': crops a source of shape {x.shape} to the "
                              f"shape of one with another number of axes, {ref.shape}")
        axis = _axis(self, cc.axis, x.ndim, "crop_conf.axis")
        n = x.ndim - axis
        if len(cc.offset) not in (0, 1, n):
            raise ConfigError(f"layer '{self.name}': crop_conf.offset needs 0, 1 or {n} values "
                              f"(one per axis from {axis}), got {len(cc.offset)}")
        offsets = [0] * n if not cc.offset else list(cc.offset) * n if len(cc.offset) == 1 \
            else list(cc.offset)
        shape, self.window = list(x.shape[:axis]), [slice(None)] * axis
        for a, o in zip(range(axis, x.ndim), offsets):
            if o + ref.shape[a] > x.shape[a]:
                raise ConfigError(f"layer '{self.name}': offset {o} and size {ref.shape[a]} on "
                                  f"axis {a} pass the end of a source of shape {x.shape}")
            shape.append(ref.shape[a])
            self.window.append(slice(o, o + ref.shape[a]))
        self.window = tuple(self.window)
        self.data = self.xp.zeros(tuple(shape), np.float32)
        self.grad = self.new_grad()

    def compute_feature(self, flag, srclayers):
        np.copyto(self.data, srclayers[0].data_for(self)[self.window])

    def compute_gradient(self, flag, srclayers):
        gsrc, gref = (s.grad_for(self) for s in srclayers)
        if gsrc is not None:
            gsrc[...] = 0
            gsrc[self.window] = self.grad
        if gref is not None:
            gref[...] = 0
