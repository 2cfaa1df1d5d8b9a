"""Convolution (im2col + GEMM) and pooling layers (src/neuralnet/neuron_layer/convolution.cc, pooling.cc), on (N, C, H, W) float32 blobs."""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from singa.errors import ConfigError
from singa.layers.base import Layer, make_params, register
from singa.layers.neuron import mark_pieces, partitioned
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


# A chunk of samples has a col matrix of at most this size (or one sample): it bounds the
# memory of nets like AlexNet (1.1 GB of col for its conv1 at batch 256) while LeNet's and
# cifar10's batches are one chunk, whose col the backward pass reuses.
CHUNK_BYTES = 1 << 27


@register(job_pb2.kConvolution, job_pb2.kCConvolution, job_pb2.kCudnnConv)
class ConvolutionLayer(Layer):
    """y[n] = W·col(x[n]) + b; gW = Σ_n g[n]·col[n]ᵀ; gb = Σ_{n,h,w} g; gx = col2im(Wᵀ·g[n]).

    W is (F, C·kh·kw), col rows in (channel, row, column) order like Caffe's im2col. A chunk of
    b samples is one GEMM on col (C·kh·kw, b·oh·ow). With stride 1 and pad < kernel, gx is
    computed as the convolution of g, padded by k−1−p, with W flipped (the transposed
    convolution), a GEMM instead of kh·kw scatter-adds, where F is not much larger than C.
    On partition_dim 1 this partition computes its filters: W and b are pieces of the whole.
    """

    feature_parts = True

    reads_all = True

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        n = src.shape[0]
        c, h, w = input_chw(self, src.shape)
        kh, kw, ph, pw, sh, sw = window(self.conf.convolution_conf)
        f = partitioned(self, self.conf.convolution_conf.num_filters, "num_filters")
        if f <= 0:
            raise ConfigError(f"layer '{self.name}': convolution_conf.num_filters must be > 0")
        oh, ow = out_size(self, h, kh, ph, sh), out_size(self, w, kw, pw, sw)
        self.chw, self.pad, self.kernel, self.stride = (c, h, w), (ph, pw), (kh, kw), (sh, sw)
        self.taps = _taps(kh, kw, sh, sw, oh, ow)
        self.weight, self.bias = self.params = make_params(
            self, {"weight": (f, c * kh * kw), "bias": (f,)})
        mark_pieces(self, {self.weight: 0, self.bias: 0})
        self.data = np.zeros((n, f, oh, ow), np.float32)
        self.grad = np.zeros_like(self.data)
        self._xpad = np.zeros((n, c, h + 2 * ph, w + 2 * pw), np.float32) if ph or pw else None
        b = max(1, min(n, CHUNK_BYTES // (c * kh * kw * oh * ow * 4)))
        self.chunks = [slice(i, min(i + b, n)) for i in range(0, n, b)]
        self._col = np.empty((c, kh, kw, b, oh, ow), np.float32)
        self._gt = np.empty((f, b, oh, ow), np.float32)     # W·col, then g, as (F, b, oh, ow)
        self._gw = np.empty((f, c * kh * kw), np.float32)
        # The transposed convolution copies F·kh·kw·H·W floats per sample into its col where
        # col2im scatter-adds C·kh·kw·oh·ow at about thrice the cost per float (measured).
        self.transposed = sh == sw == 1 and ph < kh and pw < kw and f * h * w <= 2 * c * oh * ow
        if self.transposed:
            qh, qw = kh - 1 - ph, kw - 1 - pw
            self._gtpad = np.zeros((f, b, oh + 2 * qh, ow + 2 * qw), np.float32)
            self._gcol = np.empty((f, kh, kw, b, h, w), np.float32)
            self._wflip = np.empty((c, f, kh, kw), np.float32)
            self._gx = np.empty((c, b, h, w), np.float32)
        else:
            self._gpad = np.zeros_like(self._xpad) if ph or pw else None

    def compute_feature(self, flag, srclayers):
        f = self.data.shape[1]
        xp = self._padded_input(srclayers)
        for rows in self.chunks:
            col = _im2col(xp[rows], self.kernel, self.stride, self._col)
            out = self._gt[:, :col.shape[3]]
            np.matmul(self.weight.data, col.reshape(self._gw.shape[1], -1),
                      out=out.reshape(f, -1))
            np.add(out.transpose(1, 0, 2, 3), self.bias.data[:, None, None], out=self.data[rows])

    def compute_gradient(self, flag, srclayers):
        n, f = self.data.shape[:2]
        k = self._gw.shape[1]
        if flag & job_pb2.kAggGrad:
            self.bias.grad += self.grad.sum(axis=(0, 2, 3))
        else:
            np.sum(self.grad, axis=(0, 2, 3), out=self.bias.grad)
            self.weight.grad[...] = 0
        xp = self._padded_input(srclayers) if len(self.chunks) > 1 else None
        gsrc = srclayers[0].grad_for(self)
        gx = None if gsrc is None else gsrc.reshape((n,) + self.chw)
        if gx is not None and self.transposed:
            kh, kw = self.kernel
            flipped = self.weight.data.reshape(f, -1, kh, kw)[:, :, ::-1, ::-1]
            np.copyto(self._wflip, flipped.transpose(1, 0, 2, 3))
        elif gx is not None:
            gpad = gx if self._gpad is None else self._gpad
            gpad[...] = 0
        for rows in self.chunks:
            # One chunk: col still holds the forward's.
            col = self._col if xp is None else _im2col(xp[rows], self.kernel, self.stride,
                                                       self._col)
            b = col.shape[3]
            gt = self._gt[:, :b]
            np.copyto(gt, self.grad[rows].transpose(1, 0, 2, 3))
            np.matmul(gt.reshape(f, -1), col.reshape(k, -1).T, out=self._gw)
            self.weight.grad += self._gw
            if gx is None:
                continue
            if self.transposed:
                self._transposed_conv(gt, gx[rows])
            else:
                # col is no longer needed: reuse it for Wᵀ·g, then scatter back (col2im).
                np.matmul(self.weight.data.T, gt.reshape(f, -1), out=col.reshape(k, -1))
                gp = gpad[rows]
                for i, j, r, s in self.taps:
                    gp[:, :, r, s] += col[:, i, j].transpose(1, 0, 2, 3)
        if gx is not None and not self.transposed and gpad is not gx:
            (ph, pw), (h, w) = self.pad, self.chw[1:]
            gx[...] = gpad[:, :, ph:ph + h, pw:pw + w]

    def _padded_input(self, srclayers):
        n = self.data.shape[0]
        return _padded(srclayers[0].data_for(self).reshape((n,) + self.chw), self._xpad,
                       self.pad)

    def _transposed_conv(self, gt, gx):
        """gx (b, C, H, W) = Σ_{f,i,j} Wflip[c,f,i,j]·gpad[f, n, y+i, x+j], gt (F, b, oh, ow)."""
        b, (kh, kw), (oh, ow) = gt.shape[1], self.kernel, gt.shape[2:]
        qh, qw = kh - 1 - self.pad[0], kw - 1 - self.pad[1]
        gtpad = self._gtpad[:, :b]      # its border stays zero
        gtpad[:, :, qh:qh + oh, qw:qw + ow] = gt
        gcol = _im2col(gtpad, self.kernel, (1, 1), self._gcol, channel_axis=0)
        out = self._gx[:, :b]
        np.matmul(self._wflip.reshape(len(out), -1), gcol.reshape(self._wflip[0].size, -1),
                  out=out.reshape(len(out), -1))
        np.copyto(gx, out.transpose(1, 0, 2, 3))


def _im2col(x, kernel, stride, buf, channel_axis=1):
    """col (C, kh, kw, b, oh, ow) of x (b, C, H, W) (or (C, b, H, W) if channel_axis is 0),
    written into the leading b samples of buf (C, kh, kw, B, oh, ow)."""
    (kh, kw), (sh, sw) = kernel, stride
    oh, ow = buf.shape[4:]
    view = sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw][:, :, :oh, :ow]
    col = buf[:, :, :, :x.shape[1 - channel_axis]]
    order = (1, 4, 5, 0, 2, 3) if channel_axis == 1 else (0, 4, 5, 1, 2, 3)
    np.copyto(col, view.transpose(order))
    return col


@register(job_pb2.kPooling, job_pb2.kCPooling, job_pb2.kCudnnPool)
class PoolingLayer(Layer):
    """MAX: y = max over the window (padding never wins), g routed to the first argmax (Caffe).

    AVG: y = Σ window / size, where size is k_h·k_w (Caffe clips the window to the padded
    image, which floor output sizes never pass; mshadow) or, for kCudnnPool, the window
    clipped to the image (cuDNN excludes padding).
    Output (N, C, floor((H+2p−k)/s)+1, floor((W+2p−k)/s)+1). MAX copies the k_h·k_w strided
    taps into one contiguous (k_h·k_w, N, C, oh, ow) array, reduces it over its first axis and,
    in training, keeps the first argmax's tap; its backward adds g at the flat indices of the
    argmaxes (np.add.at: overlapping windows may share one). AVG reduces windows separably:
    over their rows into (N, C, oh, W+2p), then over their columns.
    """

    feature_parts = True

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
        self.data = np.zeros((n, c, oh, ow), np.float32)
        self.grad = np.zeros_like(self.data)
        self._xpad = self._gpad = None
        hp, wp = h + 2 * ph, w + 2 * pw
        if ph or pw:
            self._xpad = np.full((n, c, hp, wp), -np.inf if self.is_max else 0, np.float32)
            self._gpad = np.zeros_like(self._xpad)
        if self.is_max:
            self.taps = _taps(kh, kw, sh, sw, oh, ow)
            self._windows = np.empty((len(self.taps),) + self.data.shape, np.float32)
            self._argmax = np.zeros(self.data.shape, np.min_scalar_type(kh * kw))
            self._step = np.empty_like(self._argmax)
            self._hit = np.empty(self.data.shape, bool)
            # flat index in the padded input of each window's first element, and of each tap
            planes = np.arange(n * c).reshape(n, c, 1, 1) * (hp * wp)
            self._base = planes + (np.arange(oh) * sh * wp)[:, None] + np.arange(ow) * sw
            self._offsets = np.array([i * wp + j for i, j, _, _ in self.taps], np.intp)
            self._index = np.empty(self.data.shape, np.intp)
        else:
            self.rows = [slice(i, i + sh * (oh - 1) + 1, sh) for i in range(kh)]
            self.cols = [slice(j, j + sw * (ow - 1) + 1, sw) for j in range(kw)]
            self._part = np.empty((n, c, oh, wp), np.float32)
            self._tmp = np.empty_like(self.data)
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
        if self.is_max:
            self._max(xp, flag & job_pb2.kTrain)
            return
        y, part = self.data, self._part
        np.copyto(part, xp[:, :, self.rows[0]])
        for rows in self.rows[1:]:
            part += xp[:, :, rows]
        np.copyto(y, part[:, :, :, self.cols[0]])
        for cols in self.cols[1:]:
            y += part[:, :, :, cols]
        y /= self._size

    def _max(self, xp, train):
        y, win = self.data, self._windows
        for t, (_, _, rows, cols) in enumerate(self.taps):
            np.copyto(win[t], xp[:, :, rows, cols])
        np.max(win, axis=0, out=y)
        if not train:
            return
        # Taps in reverse scan order, so the first maximum's index is written last (Caffe);
        # argmax += hit·(t − argmax) in wrapping unsigned ints has no data-dependent branch.
        am, step, last = self._argmax, self._step, len(self.taps) - 1
        np.equal(win[last], y, out=self._hit)
        np.multiply(self._hit, am.dtype.type(last), out=am)
        for t in range(last - 1, -1, -1):
            np.equal(win[t], y, out=self._hit)
            np.subtract(am.dtype.type(t), am, out=step)
            np.multiply(step, self._hit, out=step)
            am += step

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
        if self.is_max:
            index = self._index
            np.copyto(index, self._argmax)
            np.take(self._offsets, index, out=index)    # out is buffered (mode "raise")
            index += self._base
            np.add.at(gpad.reshape(-1), index.reshape(-1), self.grad.reshape(-1))
        else:   # the forward's separable sums, transposed: spread over columns, then rows
            tmp, part = self._tmp, self._part
            np.divide(self.grad, self._size, out=tmp)
            part[...] = 0
            for cols in self.cols:
                part[:, :, :, cols] += tmp
            for rows in self.rows:
                gpad[:, :, rows] += part
        if gpad is not gx:
            gx[...] = gpad[:, :, ph:ph + h, pw:pw + w]
