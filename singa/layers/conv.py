"""Convolution (im2col + GEMM), Caffe's deconvolution and pooling layers (src/neuralnet/neuron_layer/convolution.cc, pooling.cc; Caffe's deconv_layer.cpp), on (N, C, H, W) float32 blobs."""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from singa.device import is_host
from singa.device import threads
from singa.errors import ConfigError
from singa.layers import kernels
from singa.layers.base import Layer, make_params, register
from singa.layers.neuron import mark_pieces, partitioned
from singa.layers.param import cut
from singa.proto import job_pb2

__all__ = ["ConvolutionLayer", "DeconvolutionLayer", "PoolingLayer"]


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


def ceil_out_size(layer, size, k, p, s):
    """Caffe's pooling output size: ceil((size + 2p − k)/s) + 1, less one when p > 0 and the
    last window would start at or past size + p (src/caffe/layers/pooling_layer.cpp)."""
    out_size(layer, size, k, p, s)          # the same checks
    o = -(-(size + 2 * p - k) // s) + 1
    if p > 0 and (o - 1) * s >= size + p:
        o -= 1
    if (o - 1) * s - p >= size:     # stride > kernel: Caffe pools an empty window there
        raise ConfigError(f"layer '{layer.name}': with ceil_mode the last window (kernel {k}, "
                          f"pad {p}, stride {s}) starts past the input of size {size}")
    return o


def _matmul(a, b, out):
    """out[g] = a[g]·b[g] for each group g (first axis); one plain GEMM when there is one."""
    if len(a) == 1:
        np.matmul(a[0], b[0], out=out[0])
    else:
        np.matmul(a, b, out=out)


def _taps(kh, kw, sh, sw, oh, ow):
    """For every kernel offset (i, j): the strided (row, col) slices of the padded input it sees."""
    return [(i, j, slice(i, i + sh * (oh - 1) + 1, sh), slice(j, j + sw * (ow - 1) + 1, sw))
            for i in range(kh) for j in range(kw)]


def _padded(x, buf, pad):
    """x copied into `buf` at offset `pad` (its border holds the padding value); x if no buf."""
    ph, pw = pad
    if buf is None:
        return x
    buf[:, :, ph:ph + x.shape[2], pw:pw + x.shape[3]] = x
    return buf


# gW is one product per sample, summed, where a group's C/G·kh·kw is at most GW_BY_SAMPLE:
# LeNet's conv1 (25) 0.19 against 0.53 ms for a chunk of 32 samples as one long product of
# inner size 32·24·24; cifar10's conv1 (75) ties, and from 500 on the one product wins.
GW_BY_SAMPLE = 32

# A grouped convolution whose groups have C/G·F/G <= DIRECT_GROUP (depthwise: 1) runs as
# direct loops over the kernel taps, without a col: its per-group products are too small for
# GEMM (MobileNet v1's depthwise layers at batch 8: see bench/README.md).
DIRECT_GROUP = 4

# A 1 × 1 convolution (stride 1, no padding, one group) of at least POINTWISE_PIXELS output
# pixels runs its forward pass as one product per sample on x itself, no col (MobileNet's at
# batch 8, one thread: 28 × 28 12.4 against 13.9 ms, 56 × 56 13.8 against 14.8, 112 × 112
# 10.1 against 11.9; at 14 × 14 and 7 × 7 the products per sample are too thin: 11.7 against
# 10.1 and 10.3).
POINTWISE_PIXELS = 28 * 28

# The forward pass keeps every chunk's col for the backward pass while they total at most
# KEEP_COL_BYTES (AlexNet's conv1 at batch 256 would keep 1.1 GB); beyond, each compute thread
# has one col and the backward pass makes it again. The compiled im2col makes a col at about
# the cost of the memory traffic of keeping one past the caches: it keeps at most
# KEEP_COMPILED_COL_BYTES (cifar10 at batch 100, cols of 16-72 MB made again: 111 -> 107 ms a
# step at one thread, 71 -> 65 at two; LeNet's 4-8 MB kept, a tie).
KEEP_COL_BYTES = 1 << 27
KEEP_COMPILED_COL_BYTES = 1 << 23


@register(job_pb2.kConvolution, job_pb2.kCConvolution, job_pb2.kCudnnConv)
class ConvolutionLayer(Layer):
    """y[n] = W·col(x[n]) + b; gW = Σ_n g[n]·col[n]ᵀ; gb = Σ_{n,h,w} g; gx = col2im(Wᵀ·g[n]).

    W is (F, C·kh·kw), col rows in (channel, row, column) order like Caffe's im2col. With
    `group` G (ours, Caffe's group convolution) channels and filters are cut in G equal blocks
    and filter block i sees channel block i only: W is (F, C/G·kh·kw), every product above is
    one per block (y_i = W_i·col_i), i.e. W block-diagonal in the (F, C·kh·kw) layout. A chunk of
    b samples is one GEMM on col (C·kh·kw, b·oh·ow); gW sums the chunks' products in chunk
    order (each as gWᵀ = col·gᵀ, the faster product). With stride 1 and pad < kernel, gx is
    computed as the convolution of g, padded by k−1−p, with W flipped (the transposed
    convolution), a GEMM instead of kh·kw scatter-adds, where F is not much larger than C;
    a 1 × 1 convolution on large planes (`pointwise`) computes y[n] = W·x[n] without col;
    else col2im scatter-adds, one numpy add per kernel tap. Where numba is installed
    (`kernels.compiled`), im2col and col2im are compiled loops that pad as they copy, around
    the same products: the same bits; on a GPU they are our CUDA kernels
    (`singa.layers.cuda`), one launch each, the same bits again.
    Groups of at most DIRECT_GROUP channel·filter pairs (C/G·F/G; depthwise: 1) run without
    col, as direct loops over the kernel taps (`direct`): y = Σ_{c,i,j} W[f,c,i,j]·x shifted
    by (i, j), in (c, i, j) order; per tap, gW sums g·(x shifted) over the samples in order,
    then over the pixels (np.sum); gx adds W·g back per tap, in scan order. numba's loops
    (`loops.group_conv*`) and on a GPU our CUDA kernels (`cuda.group_conv*`) add in the same
    orders: the same bits.
    On partition_dim 1 this partition computes its filters: W and b are pieces of the whole;
    with groups, its pieces hold whole groups, whose channel block alone it reads (the other
    channels get a zero gradient from it).
    """

    capturable = True

    feature_parts = True

    reads_all = True

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        n = src.shape[0]
        c, h, w = input_chw(self, src.shape)
        self.src_chw = (c, h, w)
        kh, kw, ph, pw, sh, sw = window(self.conf.convolution_conf)
        f = partitioned(self, self.conf.convolution_conf.num_filters, "num_filters")
        if f <= 0:
            raise ConfigError(f"layer '{self.name}': convolution_conf.num_filters must be > 0")
        g, self.channels = self._group(c)
        self.group, c = g, self.channels.stop - self.channels.start
        oh, ow = out_size(self, h, kh, ph, sh), out_size(self, w, kw, pw, sw)
        self.chw, self.pad, self.kernel, self.stride = (c, h, w), (ph, pw), (kh, kw), (sh, sw)
        self.taps = _taps(kh, kw, sh, sw, oh, ow)
        k = c * kh * kw
        self.weight, self.bias = self.params = make_params(
            self, {"weight": (f, k // g), "bias": (f,)})
        mark_pieces(self, {self.weight: 0, self.bias: 0})
        self.data = self.xp.zeros((n, f, oh, ow), np.float32)
        self.grad = self.xp.zeros(self.data.shape, np.float32)
        self._loops = kernels.compiled(self.device)      # they pad as they copy
        padded = (ph or pw) and self._loops is None
        self._xpad = self.xp.zeros((n, c, h + 2 * ph, w + 2 * pw), np.float32) if padded else None
        # each chunk's gWᵀ = col·gᵀ, (G, C/G·kh·kw, F/G) (direct: gW): BLAS runs it 1.4-1.9×
        # faster than g·colᵀ on cifar10's and LeNet's shapes (bench/README.md), to the same
        # bits; made at the first backward pass (chunks × W's size: a forward-only net never
        # needs them)
        self._gws, self._k = None, k // g
        self._scratch = threads.Scratch(self._make_scratch)
        self.pointwise = False
        # by the whole layer's group, so that every partition of it runs the same loops
        self.direct = (self.conf.convolution_conf.group > 1
                       and (c // g) * (f // g) <= DIRECT_GROUP)
        if self.direct:
            self.chunks = threads.chunks(n, (c * h * w + f * oh * ow) * 4, is_host(self.data))
            self._cols, self.transposed = None, False
            self._gpad = np.zeros_like(self._xpad) if padded else None
            return
        self.chunks = threads.chunks(n, k * oh * ow * 4, is_host(self.data))
        self._cols = None
        # 1 × 1, stride 1, no padding, one group: col is x itself, one product per sample
        self.pointwise = (kh, kw, ph, pw, sh, sw, g) == (1, 1, 0, 0, 1, 1, 1) \
            and oh * ow >= POINTWISE_PIXELS
        if not self.pointwise and n * k * oh * ow * 4 <= (
                KEEP_COL_BYTES if self._loops is None else KEEP_COMPILED_COL_BYTES):
            flat = self.xp.empty(n * k * oh * ow, np.float32)
            self._cols = [flat[r.start * k * oh * ow:r.stop * k * oh * ow]
                          .reshape(c, kh, kw, r.stop - r.start, oh, ow) for r in self.chunks]
        # The transposed convolution copies F·kh·kw·H·W floats per sample into its col where
        # col2im scatter-adds C·kh·kw·oh·ow at about thrice the cost per float (measured).
        self.transposed = sh == sw == 1 and ph < kh and pw < kw and f * h * w <= 2 * c * oh * ow
        if self.transposed:
            self._wflip = self.xp.empty((g, c // g, f // g, kh, kw), np.float32)
        else:
            self._gpad = np.zeros_like(self._xpad) if padded else None

    def _group(self, c):
        """(the groups this layer computes, the slice of the `c` source channels it reads):
        convolution_conf.group, checked to divide the channels and the filters; on
        partition_dim 1 the groups of this partition's filters, which must be whole."""
        conf = self.conf
        g, f = conf.convolution_conf.group, conf.convolution_conf.num_filters
        if g < 1 or c % g or f % g:
            raise ConfigError(f"layer '{self.name}': convolution_conf.group {g} must divide "
                              f"both the input channels ({c}) and num_filters ({f})")
        if g == 1 or conf.partition_dim <= 0 or conf.num_partitions <= 1:
            return g, slice(0, c)
        start, stop = cut(f, conf.num_partitions, conf.partition_id)
        per = f // g
        if start % per or stop % per:
            raise ConfigError(f"layer '{self.name}': num_filters {f} cut over "
                              f"{conf.num_partitions} workers (partition_dim 1) splits the "
                              f"blocks of group {g} ({per} filters each); use workers that "
                              f"divide the group, or partition_dim: 0")
        return (stop - start) // per, slice(start // per * (c // g), stop // per * (c // g))

    def _gw(self):
        """W as (G, F/G, C/G·kh·kw)."""
        return self.weight.data.reshape(self.group, -1, self.weight.shape[1])

    def _w5(self):
        """W as (G, F/G, C/G, kh, kw)."""
        g, f = self.group, self.data.shape[1]
        return self.weight.data.reshape(g, f // g, -1, *self.kernel)

    def _make_scratch(self, key):
        """A compute thread's buffers for chunks of b samples: key (slot, b), or (slot, b,
        "backward") for the direct path's backward pass."""
        b = key[1]
        (c, h, w), (kh, kw), (f, oh, ow) = self.chw, self.kernel, self.data.shape[1:]
        if self.direct:
            g, numpy = self.group, self._loops is None
            if len(key) == 2:
                return {"tmp": self.xp.empty((b, g, f // g, oh, ow), np.float32)} if numpy else {}
            s = {"acc": self.xp.empty((f, c // g, kh, kw, oh, ow), np.float32)}
            if numpy:
                s["tmp"] = self.xp.empty((g, f // g, oh, ow), np.float32)
                s["gtmp"] = self.xp.empty((b, g, oh, ow), np.float32)
            return s
        s = {"gt": self.xp.empty((f, b, oh, ow), np.float32)}     # W·col, then g, as (F, b, oh, ow)
        g, k = self.group, self._k
        if k <= GW_BY_SAMPLE:
            s["gws_by_sample"] = self.xp.empty((g, b, k, f // g), np.float32)
        if self._cols is None:
            s["col"] = self.xp.empty((c, kh, kw, b, oh, ow), np.float32)
        if self.transposed:
            if self._loops is None:
                qh, qw = kh - 1 - self.pad[0], kw - 1 - self.pad[1]
                s["gtpad"] = self.xp.zeros((f, b, oh + 2 * qh, ow + 2 * qw), np.float32)  # border 0
            s["gcol"] = self.xp.empty((f, kh, kw, b, h, w), np.float32)
            s["gx"] = self.xp.empty((c, b, h, w), np.float32)
        return s

    def compute_feature(self, flag, srclayers):
        x = self._input(srclayers)
        forward = self._direct_forward if self.direct else self._forward
        threads.run(lambda i, slot: forward(x, i, slot), len(self.chunks))

    def _direct_forward(self, x, i, slot):
        rows = self.chunks[i]
        y = self.data[rows]
        if self._loops is not None:
            self._loops.group_conv(self.xp.ascontiguousarray(x[rows]), self._w5(),
                                   self.bias.data, *self.pad, *self.stride, y)
            return
        xp = _padded(x[rows], None if self._xpad is None else self._xpad[rows], self.pad)
        _group_conv(xp, self._w5(), self.taps, y, self._scratch[slot, y.shape[0]]["tmp"])
        y += self.bias.data[:, None, None]

    def _forward(self, x, i, slot):
        rows = self.chunks[i]
        if self.pointwise:
            y = self.data[rows]
            b, f = y.shape[:2]
            np.matmul(self.weight.data, x[rows].reshape(b, self.chw[0], -1),
                      out=y.reshape(b, f, -1))
            y += self.bias.data[:, None, None]
            return
        col = self._col(x, i, slot)
        f, b, g = self.data.shape[1], col.shape[3], self.group
        out = self._scratch[slot, b]["gt"]
        _matmul(self._gw(), col.reshape(g, self._k, -1), out.reshape(g, f // g, -1))
        np.add(out.transpose(1, 0, 2, 3), self.bias.data[:, None, None], out=self.data[rows])

    def _col(self, x, i, slot):
        """Chunk i's col: im2col of its samples, padded, into its kept buffer or the thread's."""
        rows = self.chunks[i]
        b = rows.stop - rows.start
        buf = self._scratch[slot, b]["col"] if self._cols is None else self._cols[i]
        if self._loops is not None:
            # a group's channels of a cut source are copied out: the loops read planes flat
            return self._loops.im2col(self.xp.ascontiguousarray(x[rows]), *self.pad, *self.stride,
                                      buf, False)
        xp = _padded(x[rows], None if self._xpad is None else self._xpad[rows], self.pad)
        return _im2col(xp, self.kernel, self.stride, buf)

    def compute_gradient(self, flag, srclayers):
        n, f = self.data.shape[:2]
        if flag & job_pb2.kAggGrad:
            self.bias.grad += self.grad.sum(axis=(0, 2, 3))
        else:
            np.sum(self.grad, axis=(0, 2, 3), out=self.bias.grad)
        x = self._input(srclayers) if self._cols is None else None
        gsrc = srclayers[0].grad_for(self)
        gx = None
        if gsrc is not None:
            whole = gsrc.reshape((n,) + self.src_chw)
            gx = whole[:, self.channels]
            if gx.shape != whole.shape:         # channels of other partitions' groups
                whole[:, :self.channels.start] = 0
                whole[:, self.channels.stop:] = 0
        if gx is not None and self.transposed:
            kh, kw = self.kernel
            flipped = self.weight.data.reshape(self.group, f // self.group, -1, kh, kw)
            np.copyto(self._wflip, flipped[..., ::-1, ::-1].transpose(0, 2, 1, 3, 4))
        if self._gws is None:     # per chunk: gW, or gWᵀ as (G, C/G·kh·kw, F/G)
            self._gws = self.xp.empty(
                (len(self.chunks),) + ((f, self._k) if self.direct
                                       else (self.group, self._k, f // self.group)), np.float32)
        backward = self._direct_backward if self.direct else self._backward
        threads.run(lambda i, slot: backward(x, gx, i, slot), len(self.chunks))
        gw = self.weight.grad if self.direct else \
            self.weight.grad.reshape(self.group, f // self.group, -1).transpose(0, 2, 1)
        if flag & job_pb2.kAggGrad:
            gw += self._gws.sum(axis=0)
        else:
            np.sum(self._gws, axis=0, out=gw)

    def _direct_backward(self, x, gx, i, slot):
        """Chunk i's share of gW into _gws[i], and its samples' gx."""
        rows = self.chunks[i]
        gy = self.grad[rows]
        b, f = gy.shape[:2]
        s = self._scratch[slot, b, "backward"]
        if self._loops is not None:
            self._loops.group_conv_wgrad(self.xp.ascontiguousarray(x[rows]), gy, *self.pad,
                                         *self.stride, s["acc"])
        else:
            xp = _padded(x[rows], None if self._xpad is None else self._xpad[rows], self.pad)
            _group_conv_wgrad(xp, gy, self.taps, s["acc"], s["tmp"])
        np.sum(s["acc"].reshape(f, self._k, -1), axis=2, out=self._gws[i])
        if gx is None:
            return
        if self._loops is not None:
            self._loops.group_conv_xgrad(gy, self._w5(), *self.pad, *self.stride, gx[rows])
            return
        gp = gx[rows] if self._gpad is None else self._gpad[rows]
        _group_conv_xgrad(gy, self._w5(), self.taps, gp, s["gtmp"])
        if self._gpad is not None:
            (ph, pw), (h, w) = self.pad, self.chw[1:]
            gx[rows] = gp[:, :, ph:ph + h, pw:pw + w]

    def _backward(self, x, gx, i, slot):
        """Chunk i's share of gWᵀ into _gws[i], and its samples' gx."""
        rows = self.chunks[i]
        # with kept cols, chunk i's still holds the forward's
        col = self._cols[i] if self._cols is not None else self._col(x, i, slot)
        f, b, k, g = self.data.shape[1], col.shape[3], self._k, self.group
        s = self._scratch[slot, b]
        gt, by_sample = s["gt"], "gws_by_sample" in s
        if gx is not None or not by_sample:     # g as (F, b, oh, ow)
            np.copyto(gt, self.grad[rows].transpose(1, 0, 2, 3))
        if by_sample:     # one product per (group, sample), summed in sample order
            np.matmul(col.reshape(g, k, b, -1).transpose(0, 2, 1, 3),
                      self.grad[rows].reshape(b, g, f // g, -1).transpose(1, 0, 3, 2),
                      out=s["gws_by_sample"])
            np.sum(s["gws_by_sample"], axis=1, out=self._gws[i])
        else:
            _matmul(col.reshape(g, k, -1), gt.reshape(g, f // g, -1).transpose(0, 2, 1),
                    self._gws[i])
        if gx is None:
            return
        if self.transposed:
            self._transposed_conv(gt, gx[rows], s)
            return
        # col is no longer needed: reuse it for Wᵀ·g, then scatter back (col2im).
        _matmul(self._gw().transpose(0, 2, 1), gt.reshape(g, f // g, -1), col.reshape(g, k, -1))
        if self._loops is not None:
            self._loops.col2im(col, *self.pad, *self.stride, gx[rows])
            return
        gp = gx[rows] if self._gpad is None else self._gpad[rows]
        gp[...] = 0
        for ti, tj, r, c in self.taps:
            gp[:, :, r, c] += col[:, ti, tj].transpose(1, 0, 2, 3)
        if self._gpad is not None:
            (ph, pw), (h, w) = self.pad, self.chw[1:]
            gx[rows] = gp[:, :, ph:ph + h, pw:pw + w]

    def _input(self, srclayers):
        x = srclayers[0].data_for(self).reshape((self.data.shape[0],) + self.src_chw)
        return x if self.chw == self.src_chw else x[:, self.channels]

    def _transposed_conv(self, gt, gx, s):
        """gx (b, C, H, W) = Σ_{f,i,j} Wflip[c,f,i,j]·gpad[f, n, y+i, x+j], gt (F, b, oh, ow);
        f over c's group only."""
        (kh, kw), (oh, ow), g = self.kernel, gt.shape[2:], self.group
        qh, qw = kh - 1 - self.pad[0], kw - 1 - self.pad[1]
        if self._loops is not None:
            gcol = self._loops.im2col(gt, qh, qw, 1, 1, s["gcol"], True)
        else:
            gtpad = s["gtpad"]
            gtpad[:, :, qh:qh + oh, qw:qw + ow] = gt
            gcol = _im2col(gtpad, self.kernel, (1, 1), s["gcol"], channel_axis=0)
        out, wflip = s["gx"], self._wflip
        _matmul(wflip.reshape(g, wflip.shape[1], -1), gcol.reshape(g, wflip[0, 0].size, -1),
                out.reshape(g, wflip.shape[1], -1))
        np.copyto(gx, out.transpose(1, 0, 2, 3))


@register(job_pb2.kDeconvolution)
class DeconvolutionLayer(Layer):
    """Caffe's Deconvolution, the transposed convolution: col = Wᵀ·x[n], y[n] = col2im(col) + b;
    gx[n] = W·col(g[n]); gW = Σ_n x[n]·col(g[n])ᵀ; gb = Σ_{n,h,w} g.

    x is (N, C, H, W), W is (C, F/G, kh, kw) (Caffe's blob), y is (N, F, s·(H−1) + k − 2p,
    …) with F = num_filters, G = group: input block i feeds output block i only. col is
    (F·kh·kw, H·W), col2im scatter-adds it into the padded output and drops the padding (the
    backward pass of the convolution of y's shape into x's). Chunks of samples run on the
    compute threads; gW sums the chunks' products in chunk order. Where numba is installed
    (`kernels.compiled`), col2im and im2col are its compiled loops, on a GPU our CUDA kernels:
    the same bits.
    """

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        n = src.shape[0]
        c, h, w = input_chw(self, src.shape)
        cc = self.conf.convolution_conf
        kh, kw, ph, pw, sh, sw = window(cc)
        f, g = cc.num_filters, cc.group
        if f <= 0:
            raise ConfigError(f"layer '{self.name}': convolution_conf.num_filters must be > 0")
        if g < 1 or c % g or f % g:
            raise ConfigError(f"layer '{self.name}': convolution_conf.group {g} must divide "
                              f"both the input channels ({c}) and num_filters ({f})")
        oh, ow = sh * (h - 1) + kh - 2 * ph, sw * (w - 1) + kw - 2 * pw
        if min(kh, kw, sh, sw, oh, ow) <= 0:
            raise ConfigError(f"layer '{self.name}': kernel ({kh}, {kw}), pad ({ph}, {pw}), "
                              f"stride ({sh}, {sw}) leave no output for an input of "
                              f"{h} × {w}")
        self.chw, self.kernel, self.pad, self.stride, self.group = \
            (c, h, w), (kh, kw), (ph, pw), (sh, sw), g
        self.weight, self.bias = self.params = make_params(
            self, {"weight": (c, f // g, kh, kw), "bias": (f,)})
        self.data = self.xp.zeros((n, f, oh, ow), np.float32)
        self.grad = self.xp.zeros(self.data.shape, np.float32)
        self._loops = kernels.compiled(self.device)
        self.taps = _taps(kh, kw, sh, sw, h, w)
        self._ypad = self._gpad = None
        if (ph or pw) and self._loops is None:
            self._ypad = self.xp.zeros((n, f, oh + 2 * ph, ow + 2 * pw), np.float32)
            self._gpad = np.zeros_like(self._ypad)      # its border stays 0
        self.chunks = threads.chunks(n, f * kh * kw * h * w * 4, is_host(self.data))
        self._gws = self.xp.empty((len(self.chunks), g, c // g, f // g * kh * kw), np.float32)
        self._scratch = threads.Scratch(self._make_scratch)

    def _make_scratch(self, key):
        (c, h, w), (kh, kw), f, b = self.chw, self.kernel, self.data.shape[1], key[1]
        return {"col": self.xp.empty((f, kh, kw, b, h, w), np.float32),
                "xt": self.xp.empty((c, b, h, w), np.float32)}

    def _gw(self):
        """W as (G, C/G, F/G·kh·kw)."""
        return self.weight.data.reshape(self.group, self.chw[0] // self.group, -1)

    def _xt(self, x, rows, s):
        """The chunk's x as (G, C/G, b·H·W)."""
        np.copyto(s["xt"], x[rows].transpose(1, 0, 2, 3))
        return s["xt"].reshape(self.group, self.chw[0] // self.group, -1)

    def compute_feature(self, flag, srclayers):
        x = srclayers[0].data_for(self).reshape((self.data.shape[0],) + self.chw)
        threads.run(lambda i, slot: self._forward(x, self.chunks[i], slot), len(self.chunks))

    def _forward(self, x, rows, slot):
        s = self._scratch[slot, rows.stop - rows.start]
        col = s["col"]
        _matmul(self._gw().transpose(0, 2, 1), self._xt(x, rows, s),
                col.reshape(self.group, self._gws.shape[3], -1))
        y = self.data[rows]
        if self._loops is not None:
            self._loops.col2im(col, *self.pad, *self.stride, y)
        else:
            yp = y if self._ypad is None else self._ypad[rows]
            yp[...] = 0
            for ti, tj, r, c in self.taps:
                yp[:, :, r, c] += col[:, ti, tj].transpose(1, 0, 2, 3)
            if self._ypad is not None:
                (ph, pw), (oh, ow) = self.pad, y.shape[2:]
                np.copyto(y, yp[:, :, ph:ph + oh, pw:pw + ow])
        y += self.bias.data[:, None, None]

    def compute_gradient(self, flag, srclayers):
        src = srclayers[0]
        n = self.data.shape[0]
        x = src.data_for(self).reshape((n,) + self.chw)
        gsrc = src.grad_for(self)
        gx = None if gsrc is None else gsrc.reshape((n,) + self.chw)
        threads.run(lambda i, slot: self._backward(x, gx, i, slot), len(self.chunks))
        gw = self.weight.grad.reshape(self._gws.shape[1:])
        gb = self.grad.sum(axis=(0, 2, 3))
        if flag & job_pb2.kAggGrad:
            gw += self._gws.sum(axis=0)
            self.bias.grad += gb
        else:
            np.sum(self._gws, axis=0, out=gw)
            np.copyto(self.bias.grad, gb)

    def _backward(self, x, gx, i, slot):
        """Chunk i's share of gW into _gws[i], and its samples' gx."""
        rows = self.chunks[i]
        s = self._scratch[slot, rows.stop - rows.start]
        col, g = s["col"], self.grad[rows]
        if self._loops is not None:
            self._loops.im2col(g, *self.pad, *self.stride, col, False)
        else:
            _im2col(_padded(g, None if self._gpad is None else self._gpad[rows], self.pad),
                    self.kernel, self.stride, col)
        col = col.reshape(self.group, self._gws.shape[3], -1)
        xt = self._xt(x, rows, s)
        _matmul(xt, col.transpose(0, 2, 1), self._gws[i])
        if gx is not None:
            _matmul(self._gw(), col, xt)        # xt is no longer needed: gx as (C, b, H, W)
            np.copyto(gx[rows], s["xt"].transpose(1, 0, 2, 3))


def _group_conv(xp, w, taps, y, tmp):
    """y (b, G·m, oh, ow) = Σ_{c, (i, j)} w[g, k, c, i, j]·xp[:, g·cg + c, i::sh, j::sw] for
    filter g·m + k, one product per (c, tap) over the whole chunk, in (c, i, j) order;
    xp (b, G·cg, ·, ·) padded, w (G, m, cg, kh, kw), tmp (b, G, m, oh, ow)."""
    ng, m, cg = w.shape[:3]
    b, (oh, ow) = y.shape[0], y.shape[2:]
    y5, x5 = y.reshape(b, ng, m, oh, ow), xp.reshape(b, ng, cg, *xp.shape[2:])
    for c in range(cg):
        for i, j, r, s in taps:
            first = c == 0 and i == j == 0
            np.multiply(x5[:, :, c:c + 1, r, s], w[:, :, c, i, j, None, None],
                        out=y5 if first else tmp)
            if not first:
                y5 += tmp


def _group_conv_wgrad(xp, gy, taps, acc, tmp):
    """acc (G·m, cg, kh, kw, oh, ow) = Σ_n gy[n, g·m + k]·xp[n, g·cg + c, i::sh, j::sw], the
    samples summed in order; tmp (G, m, oh, ow)."""
    b, f, oh, ow = gy.shape
    cg = acc.shape[1]
    ng = xp.shape[1] // cg
    g5, x5 = gy.reshape(b, ng, f // ng, oh, ow), xp.reshape(b, ng, cg, *xp.shape[2:])
    a = acc.reshape(ng, f // ng, *acc.shape[1:])
    for c in range(cg):
        for i, j, r, s in taps:
            dst = a[:, :, c, i, j]
            np.multiply(g5[0], x5[0, :, c:c + 1, r, s], out=dst)
            for n in range(1, b):
                np.multiply(g5[n], x5[n, :, c:c + 1, r, s], out=tmp)
                dst += tmp


def _group_conv_xgrad(gy, w, taps, gp, tmp):
    """gp (b, G·cg, ·, ·) = 0, then gp[:, g·cg + c, i::sh, j::sw] += w[g, k, c, i, j]·
    gy[:, g·m + k] for each c, tap (i, j) in scan order, then k; tmp (b, G, oh, ow)."""
    ng, m, cg = w.shape[:3]
    b, (oh, ow) = gy.shape[0], gy.shape[2:]
    g5, p5 = gy.reshape(b, ng, m, oh, ow), gp.reshape(b, ng, cg, *gp.shape[2:])
    gp[...] = 0
    for c in range(cg):
        for i, j, r, s in taps:
            for k in range(m):
                np.multiply(g5[:, :, k], w[:, k, c, i, j, None, None], out=tmp)
                p5[:, :, c, r, s] += tmp


def _im2col(x, kernel, stride, col, channel_axis=1):
    """col (C, kh, kw, b, oh, ow) of x (b, C, H, W) (or (C, b, H, W) if channel_axis is 0),
    written into `col` and returned."""
    (kh, kw), (sh, sw) = kernel, stride
    oh, ow = col.shape[4:]
    view = sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw][:, :, :oh, :ow]
    order = (1, 4, 5, 0, 2, 3) if channel_axis == 1 else (0, 4, 5, 1, 2, 3)
    np.copyto(col, view.transpose(order))
    return col


@register(job_pb2.kPooling, job_pb2.kCPooling, job_pb2.kCudnnPool)
class PoolingLayer(Layer):
    """MAX: y = max over the window (padding never wins), g routed to the first argmax (Caffe).

    AVG: y = Σ window / size, the sum over real pixels, where size is the window clipped at
    H + p, W + p (Caffe: a window [o·s − p, o·s − p + k) counts its padding cells inside
    [−p, H + p), not those beyond), which is k_h·k_w for floor output sizes (mshadow's
    divisor) or, for kCudnnPool, the window clipped to the image (cuDNN excludes padding).
    Output (N, C, floor((H+2p−k)/s)+1, floor((W+2p−k)/s)+1), or with `ceil_mode` (ours)
    Caffe's ceil((H+2p−k)/s)+1, less one if the last window starts at or past H + p (every
    window keeps a real pixel); the padded buffer then reaches the last window's end, its
    cells beyond H + p padding too. MAX copies the k_h·k_w strided taps into one contiguous
    (k_h·k_w, N, C, oh, ow) array, reduces it over its first axis and, in training, keeps
    the first argmax's tap; its backward adds g at the flat indices of the
    argmaxes (np.add.at: overlapping windows may share one). AVG reduces windows separably:
    over their rows into (N, C, oh, W+2p), then over their columns. Both run by chunks of
    samples on the compute threads. On a GPU each pass is one of our CUDA kernels
    (`kernels.gpu`), which pad as they read and add in the same orders (the backward
    passes gather: each input cell sums its windows' gradients): the same bits.
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
        self.grad = self.xp.zeros(self.data.shape, np.float32)
        self.window, self.stride = (kh, kw), (sh, sw)
        self._kernels = kernels.gpu(self.device)
        if self._kernels is not None:
            if self.is_max:
                self._argmax = self.xp.zeros(self.data.shape, np.int32)
            else:
                self._size = self.device.put(
                    self._divisor(h, w, kh, kw, ph, pw, sh, sw, oh, ow))
            return
        self._xpad = self._gpad = None
        # the padded input reaches the end of the last window (past H + 2p in ceil mode)
        hp = ph + h + max(ph, (oh - 1) * sh + kh - ph - h)
        wp = pw + w + max(pw, (ow - 1) * sw + kw - pw - w)
        if (hp, wp) != (h, w):
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
        self.grad = self.xp.zeros(self.data.shape, np.float32)
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

    def compute_feature(self, flag, srclayers):
        x = srclayers[0].data_for(self).reshape((self.data.shape[0],) + self.chw)
        train = flag & job_pb2.kTrain
        if self.is_global:
            self._global_forward(x, train)
            return
        threads.run(lambda i, _: self._forward(x, self.chunks[i], train), len(self.chunks))

    def _forward(self, x, rows, train):
        if self._kernels is not None:
            k = (*self.window, *self.pad, *self.stride)
            if self.is_max:
                self._kernels.max_pool(x[rows], *k, self.data[rows], self._argmax[rows], train)
            else:
                self._kernels.avg_pool(x[rows], *k, self._size, self.data[rows])
            return
        xp = _padded(x[rows], None if self._xpad is None else self._xpad[rows], self.pad)
        if self.is_max:
            self._max(xp, rows, train)
            return
        y, part = self.data[rows], self._part[rows]
        np.copyto(part, xp[:, :, self.rows[0]])
        for r in self.rows[1:]:
            part += xp[:, :, r]
        np.copyto(y, part[:, :, :, self.cols[0]])
        for c in self.cols[1:]:
            y += part[:, :, :, c]
        y /= self._size

    def _max(self, xp, rows, train):
        y, win = self.data[rows], self._windows[:, rows]
        for t, (_, _, r, c) in enumerate(self.taps):
            np.copyto(win[t], xp[:, :, r, c])
        np.max(win, axis=0, out=y)
        if not train:
            return
        # Taps in reverse scan order, so the first maximum's index is written last (Caffe);
        # argmax += hit·(t − argmax) in wrapping unsigned ints has no data-dependent branch.
        am, step, hit, last = self._argmax[rows], self._step[rows], self._hit[rows], \
            len(self.taps) - 1
        np.equal(win[last], y, out=hit)
        np.multiply(hit, am.dtype.type(last), out=am)
        for t in range(last - 1, -1, -1):
            np.equal(win[t], y, out=hit)
            np.subtract(am.dtype.type(t), am, out=step)
            np.multiply(step, hit, out=step)
            am += step

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
        if self._kernels is not None:
            k = (*self.window, *self.pad, *self.stride)
            if self.is_max:
                self._kernels.max_pool_backward(self.grad[rows], self._argmax[rows], *k, gx[rows])
            else:
                self._kernels.avg_pool_backward(self.grad[rows], self._size, *k, gx[rows])
            return
        (ph, pw), (h, w) = self.pad, self.chw[1:]
        gpad = gx[rows] if self._gpad is None else self._gpad[rows]
        gpad[...] = 0
        if self.is_max:
            # flat indices of the argmaxes in the padded chunk (its first sample at 0)
            index = self._index[rows]
            np.copyto(index, self._argmax[rows])
            np.take(self._offsets, index, out=index)    # out is buffered (mode "raise")
            index += self._base[:rows.stop - rows.start]
            np.add.at(gpad.reshape(-1), index.reshape(-1), self.grad[rows].reshape(-1))
        else:   # the forward's separable sums, transposed: spread over columns, then rows
            tmp, part = self._tmp[rows], self._part[rows]
            np.divide(self.grad[rows], self._size, out=tmp)
            part[...] = 0
            for c in self.cols:
                part[:, :, :, c] += tmp
            for r in self.rows:
                gpad[:, :, r] += part
        if self._gpad is not None:
            gx[rows] = gpad[:, :, ph:ph + h, pw:pw + w]
