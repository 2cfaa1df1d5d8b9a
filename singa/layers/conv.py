"""Convolution (im2col + GEMM) and pooling layers (src/neuralnet/neuron_layer/convolution.cc, pooling.cc), on (N, C, H, W) float32 blobs."""
import numpy as np

from singa.errors import ConfigError
from singa.layers.base import Layer, register
from singa.layers.neuron import make_params, partitioned
from singa.proto import job_pb2

__all__ = ["ConvolutionLayer", "PoolingLayer"]


def window(conf):
    """(kh, kw, ph, pw, sh, sw) of a conv/pooling conf: `kernel` etc. if set, else _y/_x pairs."""
    def pair(name):
        if conf.HasField(name):
            v = getattr(conf, name)
            return v, v
        return getattr(conf, name + "_y"), getattr(conf, name + "_x")
    return pair("kernel") + pair("pad") + pair("stride")


def input_chw(layer, shape):
    """(C, H, W) of a source blob (N, C, H, W); a 3-D source (N, H, W) has C = 1."""
    if len(shape) == 4:
        return shape[1:]
    if len(shape) == 3:
        return (1,) + tuple(shape[1:])
    raise ConfigError(f"layer '{layer.name}' needs a source of shape (N, C, H, W) or (N, H, W), "
                      f"got {tuple(shape)}")


def out_size(layer, size, k, p, s):
    """floor((size + 2p − k)/s) + 1, checked to be positive."""
    o = (size + 2 * p - k) // s + 1
    if k <= 0 or s <= 0 or o <= 0:
        raise ConfigError(f"layer '{layer.name}': kernel {k}, pad {p}, stride {s} do not fit "
                          f"an input of size {size}")
    return o


def _taps(kh, kw, sh, sw, oh, ow):
    """For every kernel offset (i, j): the strided (row, col) slices of the padded input it sees."""
    return [(i, j, slice(i, i + sh * (oh - 1) + 1, sh), slice(j, j + sw * (ow - 1) + 1, sw))
            for i in range(kh) for j in range(kw)]


def _padded(x, buf, pad):
    """x copied into the interior of `buf` (its border holds the padding value); x if no pad."""
    ph, pw = pad
    if ph == 0 and pw == 0:
        return x
    buf[:, :, ph:ph + x.shape[2], pw:pw + x.shape[3]] = x
    return buf


@register(job_pb2.kConvolution, job_pb2.kCConvolution, job_pb2.kCudnnConv)
class ConvolutionLayer(Layer):
    """y[n] = W·col(x[n]) + b; gW = Σ_n g[n]·col[n]ᵀ; gb = Σ_{n,h,w} g; gx = col2im(Wᵀ·g[n]).

    W is (F, C·kh·kw), col rows in (channel, row, column) order like Caffe's im2col.
    """

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        n = src.shape[0]
        c, h, w = input_chw(self, src.shape)
        kh, kw, ph, pw, sh, sw = window(self.conf.convolution_conf)
        f = partitioned(self, self.conf.convolution_conf.num_filters)
        if f <= 0:
            raise ConfigError(f"layer '{self.name}': convolution_conf.num_filters must be > 0")
        oh, ow = out_size(self, h, kh, ph, sh), out_size(self, w, kw, pw, sw)
        self.chw, self.pad = (c, h, w), (ph, pw)
        self.taps = _taps(kh, kw, sh, sw, oh, ow)
        self.weight, self.bias = self.params = make_params(
            self, {"weight": (f, c * kh * kw), "bias": (f,)})
        self.data = np.zeros((n, f, oh, ow), np.float32)
        self.grad = np.zeros_like(self.data)
        # Zero-padded copies of the input (its border stays zero) and of its gradient.
        self._xpad = self._gpad = None
        if ph or pw:
            self._xpad = np.zeros((n, c, h + 2 * ph, w + 2 * pw), np.float32)
            self._gpad = np.zeros_like(self._xpad)
        self._col = np.empty((n, c, kh, kw, oh, ow), np.float32)
        self._gw = np.empty((n, f, c * kh * kw), np.float32)

    def compute_feature(self, flag, srclayers):
        n = self.data.shape[0]
        c, h, w = self.chw
        xp = _padded(srclayers[0].data_for(self).reshape(n, c, h, w), self._xpad, self.pad)
        col = self._col
        for i, j, rows, cols in self.taps:
            col[:, :, i, j] = xp[:, :, rows, cols]
        y = self.data.reshape(n, self.data.shape[1], -1)
        np.matmul(self.weight.data, col.reshape(n, -1, y.shape[2]), out=y)
        y += self.bias.data[:, None]

    def compute_gradient(self, flag, srclayers):
        n, f = self.data.shape[:2]
        g = self.grad.reshape(n, f, -1)
        col = self._col.reshape(n, -1, g.shape[2])
        if flag & job_pb2.kAggGrad:
            self.bias.grad += g.sum(axis=(0, 2))
        else:
            np.sum(g, axis=(0, 2), out=self.bias.grad)
        np.matmul(g, col.transpose(0, 2, 1), out=self._gw)
        if flag & job_pb2.kAggGrad:
            self.weight.grad += self._gw.sum(axis=0)
        else:
            np.sum(self._gw, axis=0, out=self.weight.grad)
        src = srclayers[0]
        gsrc = src.grad_for(self)
        if gsrc is None:
            return
        # The forward's col is no longer needed: reuse it for Wᵀ·g, then scatter back (col2im).
        np.matmul(self.weight.data.T, g, out=col)
        c, h, w = self.chw
        ph, pw = self.pad
        gx = gsrc.reshape(n, c, h, w)
        gpad = gx if self._gpad is None else self._gpad
        gpad[...] = 0
        for i, j, rows, cols in self.taps:
            gpad[:, :, rows, cols] += self._col[:, :, i, j]
        if gpad is not gx:
            gx[...] = gpad[:, :, ph:ph + h, pw:pw + w]


@register(job_pb2.kPooling, job_pb2.kCPooling, job_pb2.kCudnnPool)
class PoolingLayer(Layer):
    """MAX: y = max over the window (padding never wins), g routed to the first argmax (Caffe).

    AVG: y = Σ window / size, where size is k_h·k_w (Caffe clips the window to the padded
    image, which floor output sizes never pass; mshadow) or, for kCudnnPool, the window
    clipped to the image (cuDNN excludes padding).
    Output (N, C, floor((H+2p−k)/s)+1, floor((W+2p−k)/s)+1).
    """

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        n = src.shape[0]
        c, h, w = input_chw(self, src.shape)
        conf = self.conf.pooling_conf
        kh, kw, ph, pw, sh, sw = window(conf)
        if ph >= kh or pw >= kw:
            raise ConfigError(f"layer '{self.name}': pooling pad ({ph}, {pw}) must be smaller "
                              f"than the kernel ({kh}, {kw})")
        oh, ow = out_size(self, h, kh, ph, sh), out_size(self, w, kw, pw, sw)
        self.chw, self.pad, self.is_max = (c, h, w), (ph, pw), conf.pool == job_pb2.PoolingProto.MAX
        self.taps = _taps(kh, kw, sh, sw, oh, ow)
        self.data = np.zeros((n, c, oh, ow), np.float32)
        self.grad = np.zeros_like(self.data)
        self._xpad = self._gpad = None
        if ph or pw:
            self._xpad = np.full((n, c, h + 2 * ph, w + 2 * pw), -np.inf if self.is_max else 0,
                                 np.float32)
            self._gpad = np.zeros_like(self._xpad)
        self._tmp = np.empty_like(self.data)
        if self.is_max:
            self._argmax = np.zeros(self.data.shape, np.int32)
            self._hit = np.empty(self.data.shape, bool)
        else:
            self._size = self._divisor(h, w, kh, kw, ph, pw, sh, sw, oh, ow)

    def _divisor(self, h, w, kh, kw, ph, pw, sh, sw, oh, ow):
        """Window sizes (oh, ow) by which AVG divides; see the class docstring."""
        if self.conf.type != job_pb2.kCudnnPool:
            return np.full((oh, ow), kh * kw, np.float32)
        sizes = []
        for size, o, k, p, s in ((h, oh, kh, ph, sh), (w, ow, kw, pw, sw)):
            start = np.arange(o) * s - p
            sizes.append(np.minimum(start + k, size) - np.maximum(start, 0))
        return np.outer(sizes[0], sizes[1]).astype(np.float32)

    def compute_feature(self, flag, srclayers):
        n = self.data.shape[0]
        c, h, w = self.chw
        xp = _padded(srclayers[0].data_for(self).reshape(n, c, h, w), self._xpad, self.pad)
        y = self.data
        _, _, rows, cols = self.taps[0]
        np.copyto(y, xp[:, :, rows, cols])
        if self.is_max:
            self._argmax[...] = 0
            for t, (_, _, rows, cols) in enumerate(self.taps[1:], 1):
                win = xp[:, :, rows, cols]
                # Strictly greater keeps the first maximum in scan order, as Caffe does.
                np.greater(win, y, out=self._hit)
                np.copyto(y, win, where=self._hit)
                np.copyto(self._argmax, t, where=self._hit)
        else:
            for _, _, rows, cols in self.taps[1:]:
                y += xp[:, :, rows, cols]
            y /= self._size

    def compute_gradient(self, flag, srclayers):
        gsrc = srclayers[0].grad_for(self)
        if gsrc is None:
            return
        n = self.data.shape[0]
        c, h, w = self.chw
        ph, pw = self.pad
        gx = gsrc.reshape(n, c, h, w)
        gpad = gx if self._gpad is None else self._gpad
        gpad[...] = 0
        tmp = self._tmp
        if not self.is_max:
            np.divide(self.grad, self._size, out=tmp)
        for t, (_, _, rows, cols) in enumerate(self.taps):
            if self.is_max:
                np.equal(self._argmax, t, out=self._hit)
                np.multiply(self.grad, self._hit, out=tmp)
            gpad[:, :, rows, cols] += tmp
        if gpad is not gx:
            gx[...] = gpad[:, :, ph:ph + h, pw:pw + w]
