"""Pooling: MAX and AVG over windows, or the whole plane (src/neuralnet/neuron_layer/pooling.cc; Caffe's pooling_layer.cpp), on (N, C, H, W) float32 blobs."""
import numpy as np

from singa.device import is_host
from singa.device import threads
from singa.errors import ConfigError
from singa.layers import kernels
from singa.layers.base import Layer, register
from singa.layers.conv import ceil_out_size, input_chw, out_size, window
from singa.proto import job_pb2

__all__ = ["PoolingLayer"]


@register(job_pb2.kPooling, job_pb2.kCPooling, job_pb2.kCudnnPool)
class PoolingLayer(Layer):
    """MAX: y = max over the window (padding never wins), g routed to the first argmax (Caffe).

    AVG: y = Σ window / size, the sum over real pixels, where size is the window clipped at
    H + p, W + p (Caffe: a window [o·s − p, o·s − p + k) counts its padding cells inside
    [−p, H + p), not those beyond), which is k_h·k_w for floor output sizes (mshadow's
    divisor) or, for kCudnnPool, the window clipped to the image (cuDNN excludes padding).
    Output (N, C, floor((H+2p−k)/s)+1, floor((W+2p−k)/s)+1), or with `ceil_mode` (ours)
    Caffe's ceil((H+2p−k)/s)+1, less one if the last window starts at or past H + p (every
    window keeps a real pixel); the padded input then reaches the last window's end, its
    cells beyond H + p padding too. In training MAX keeps the first argmax's tap, to which
    its backward routes g. Both run by chunks of samples on the compute threads, each pass
    one call of the layer's kernels (`kernels.choose`): on the CPU numpy's (MAX reduces the
    windows' taps as one array, AVG the windows separably, over their rows then their
    columns), on a GPU our CUDA kernels, which pad as they read and add in the same orders
    (the backward passes gather: each input cell sums its windows' gradients): the same
    bits.
    With `global_pooling` (ours, Caffe's) the window is the whole H × W: y (N, C, 1, 1) is
    the max (g to the first argmax) or the mean (gx = g/(H·W)) of each plane, in one
    reduction.
    """

    capturable = True

    feature_parts = True

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        n = src.shape[0]
        c, h, w = input_chw(self, src.shape)
        conf = self.conf.pooling_conf
        self.is_global = conf.global_pooling
        if self.is_global:
            self._setup_global(conf, n, c, h, w)
            return
        kh, kw, ph, pw, sh, sw = window(conf)
        if ph >= kh or pw >= kw:
            raise ConfigError(f"layer '{self.name}': pooling pad ({ph}, {pw}) must be smaller "
                              f"than the kernel ({kh}, {kw})")
        size = ceil_out_size if conf.ceil_mode else out_size
        oh, ow = size(self, h, kh, ph, sh), size(self, w, kw, pw, sw)
        self.chw, self.pad, self.is_max = (c, h, w), (ph, pw), conf.pool == job_pb2.PoolingProto.MAX
        self.data = self.xp.zeros((n, c, oh, ow), np.float32)
        self.chunks = threads.chunks(n, kh * kw * c * oh * ow * 4, is_host(self.data))
        self.grad = self.new_grad()
        self.window, self.stride = (kh, kw), (sh, sw)
        self.kernels = kernels.choose(self.device)
        if self.is_max:
            self._argmax = self.xp.zeros(self.data.shape, self.kernels.argmax_dtype(kh, kw))
        else:
            self._size = self.device.put(self._divisor(h, w, kh, kw, ph, pw, sh, sw, oh, ow))

    def _setup_global(self, conf, n, c, h, w):
        given = [f for f in ("kernel", "kernel_x", "kernel_y") if conf.HasField(f)] + \
            [f for f in ("pad", "pad_x", "pad_y") if getattr(conf, f)] + \
            [f for f in ("stride", "stride_x", "stride_y")
             if conf.HasField(f) and getattr(conf, f) != 1]
        if given:
            raise ConfigError(f"layer '{self.name}': global_pooling pools the whole H × W (pad "
                              f"0, stride 1); it takes no {', '.join(given)}")
        self.chw, self.is_max = (c, h, w), conf.pool == job_pb2.PoolingProto.MAX
        self.data = self.xp.zeros((n, c, 1, 1), np.float32)
        self.grad = self.new_grad()
        if self.is_max:
            self._argmax = self.xp.zeros((n, c, 1), np.intp)
            self._plane = self.xp.arange(h * w)
            self._hit = self.xp.empty((n, c, h * w), bool)

    def _global_forward(self, x, train):
        n, c = self.data.shape[:2]
        x, y = x.reshape(n, c, -1), self.data.reshape(n, c)
        if not self.is_max:
            np.sum(x, axis=2, out=y)
            y /= np.float32(x.shape[2])
            return
        np.max(x, axis=2, out=y)
        if train:
            np.argmax(x, axis=2, out=self._argmax.reshape(n, c))

    def _global_backward(self, gx):
        n, c = self.data.shape[:2]
        g, gx = self.grad.reshape(n, c, 1), gx.reshape(n, c, -1)
        if self.is_max:
            np.equal(self._plane, self._argmax, out=self._hit)
            np.multiply(self._hit, g, out=gx)
        else:
            np.divide(g, np.float32(gx.shape[2]), out=gx)

    def _divisor(self, h, w, kh, kw, ph, pw, sh, sw, oh, ow):
        """Window sizes (oh, ow) by which AVG divides; see the class docstring."""
        cudnn = self.conf.type == job_pb2.kCudnnPool
        sizes = []
        for size, o, k, p, s in ((h, oh, kh, ph, sh), (w, ow, kw, pw, sw)):
            start = np.arange(o) * s - p
            sizes.append(np.minimum(start + k, size) - np.maximum(start, 0) if cudnn
                         else np.minimum(start + k, size + p) - start)
        return np.outer(sizes[0], sizes[1]).astype(np.float32)

    def by_rows(self, flag, srclayers):
        if self.is_global:
            return None
        x = srclayers[0].data_for(self).reshape((self.data.shape[0],) + self.chw)
        train = flag & job_pb2.kTrain
        return lambda rows: self._forward(x, rows, train)

    def compute_feature(self, flag, srclayers):
        if self.computed_ahead():
            return
        x = srclayers[0].data_for(self).reshape((self.data.shape[0],) + self.chw)
        train = flag & job_pb2.kTrain
        if self.is_global:
            self._global_forward(x, train)
            return
        threads.run(lambda i, _: self._forward(x, self.chunks[i], train), len(self.chunks))

    def _forward(self, x, rows, train):
        k = (*self.window, *self.pad, *self.stride)
        if self.is_max:
            self.kernels.max_pool(x[rows], *k, self.data[rows], self._argmax[rows], train)
        else:
            self.kernels.avg_pool(x[rows], *k, self._size, self.data[rows])

    def compute_gradient(self, flag, srclayers):
        gsrc = srclayers[0].grad_for(self)
        if gsrc is None:
            return
        gx = gsrc.reshape((self.data.shape[0],) + self.chw)
        if self.is_global:
            self._global_backward(gx)
            return
        threads.run(lambda i, _: self._backward(gx, self.chunks[i]), len(self.chunks))

    def _backward(self, gx, rows):
        k = (*self.window, *self.pad, *self.stride)
        if self.is_max:
            self.kernels.max_pool_backward(self.grad[rows], self._argmax[rows], *k, gx[rows])
        else:
            self.kernels.avg_pool_backward(self.grad[rows], self._size, *k, gx[rows])
