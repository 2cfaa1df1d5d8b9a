"""Convolution (im2col + GEMM) and Caffe's deconvolution layers (src/neuralnet/neuron_layer/convolution.cc; Caffe's deconv_layer.cpp), on (N, C, H, W) float32 blobs; the window arithmetic pooling shares."""
import numpy as np

from singa.device import is_host
from singa.device import threads
from singa.errors import ConfigError
from singa.layers import kernels
from singa.layers.base import Layer, make_params, register
from singa.layers.neuron import mark_pieces, partitioned
from singa.layers.param import cut
from singa.proto import job_pb2

__all__ = ["ConvolutionLayer", "DeconvolutionLayer", "window", "input_chw", "out_size",
           "ceil_out_size"]


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
    else col2im scatter-adds. im2col, col2im and the direct loops below are the layer's
    kernels (`kernels.choose`): numpy's calls, one per kernel tap; where numba is installed
    compiled loops that pad as they copy, around the same products: the same bits; on a GPU
    our CUDA kernels, one launch each, the same bits again.
    Groups of at most DIRECT_GROUP channel·filter pairs (C/G·F/G; depthwise: 1) run without
    col, as direct loops over the kernel taps (`direct`): y = Σ_{c,i,j} W[f,c,i,j]·x shifted
    by (i, j), in (c, i, j) order; per tap, gW sums g·(x shifted) over the samples in order,
    then over the pixels (np.sum); gx adds W·g back per tap, in scan order (`group_conv*` of
    each kernel module, all adding in these orders: the same bits).
    Where oneDNN is installed (`kernels.convolution`) each chunk of samples is instead one
    oneDNN call per pass at one thread (its direct convolution, groups included), the chunks'
    gW summed in chunk order as above, gb ours; on a GPU with cuDNN, one cuDNN call per pass
    on the whole batch (`kernels.cudnn`). On the host, a chunk's forward also computes
    that chunk's rows of the layers chained after it (`then`: BatchNorm on global statistics,
    Scale, activations, pooling, LRN), while its output is in the cache: the same operations,
    the same bits.
    A conf that lists one param has W alone (Keras' use_bias=False): no b, y[n] = W·col(x[n]).
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
        #: [(layer, its sources)]: a chain of layers after this one on the host whose forward
        #: passes each chunk of samples computes too (`Layer.by_rows`, set by the net)
        self.then = []
        kh, kw, ph, pw, sh, sw = window(self.conf.convolution_conf)
        f = partitioned(self, self.conf.convolution_conf.num_filters, "num_filters")
        if f <= 0:
            raise ConfigError(f"layer '{self.name}': convolution_conf.num_filters must be > 0")
        g, self.channels = self._group(c)
        self.group, c = g, self.channels.stop - self.channels.start
        oh, ow = out_size(self, h, kh, ph, sh), out_size(self, w, kw, pw, sw)
        self.chw, self.pad, self.kernel, self.stride = (c, h, w), (ph, pw), (kh, kw), (sh, sw)
        k = c * kh * kw
        shapes = {"weight": (f, k // g)}
        if len(self.conf.param) != 1:
            shapes["bias"] = (f,)
        self.params = make_params(self, shapes)
        self.weight, self.bias = (self.params + [None])[:2]
        mark_pieces(self, dict.fromkeys(self.params, 0))
        self.data = self.xp.zeros((n, f, oh, ow), np.float32)
        self.grad = self.new_grad()
        self.kernels = kernels.choose(self.device)
        engine = kernels.convolution(self.device)
        # oneDNN's weight gradient is slow where a filter sees few inputs: those (LeNet's
        # conv1, k = 25: 10.8 against 4.95 ms a pass at one thread) stay on im2col where the
        # net trains (forward alone, MobileNet's conv1, k = 27, batch 8: 12.6 ms on im2col)
        self.engine = None
        if engine and (g > 1 or k > GW_BY_SAMPLE or self.forward_only or self.device.gpu
                       is not None):
            # chunks of samples, each a oneDNN call at one thread (a GPU: the batch at once)
            self.chunks = threads.chunks(n, (c * h * w + f * oh * ow) * 4, is_host(self.data))
            self.engine = engine.Conv((c, h, w), f, (kh, kw), (ph, pw), (sh, sw), g,
                                      self.bias is not None,
                                      [r.stop - r.start for r in self.chunks])
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
        if self.engine:
            self._cols, self.direct, self.transposed = None, False, False
            return
        if self.direct:
            # the direct kernels add a bias: zeros for a layer without one
            self._zero_bias = self.xp.zeros(f, np.float32) if self.bias is None else None
            self.chunks = threads.chunks(n, (c * h * w + f * oh * ow) * 4, is_host(self.data))
            self._cols, self.transposed = None, False
            return
        self.chunks = threads.chunks(n, k * oh * ow * 4, is_host(self.data))
        self._cols = None
        # 1 × 1, stride 1, no padding, one group: col is x itself, one product per sample
        self.pointwise = (kh, kw, ph, pw, sh, sw, g) == (1, 1, 0, 0, 1, 1, 1) \
            and oh * ow >= POINTWISE_PIXELS
        if not self.pointwise and n * k * oh * ow * 4 <= (
                KEEP_COMPILED_COL_BYTES if self.kernels.COMPILED else KEEP_COL_BYTES):
            flat = self.xp.empty(n * k * oh * ow, np.float32)
            self._cols = [flat[r.start * k * oh * ow:r.stop * k * oh * ow]
                          .reshape(c, kh, kw, r.stop - r.start, oh, ow) for r in self.chunks]
        # The transposed convolution copies F·kh·kw·H·W floats per sample into its col where
        # col2im scatter-adds C·kh·kw·oh·ow at about thrice the cost per float (measured).
        self.transposed = sh == sw == 1 and ph < kh and pw < kw and f * h * w <= 2 * c * oh * ow
        if self.transposed:
            self._wflip = self.xp.empty((g, c // g, f // g, kh, kw), np.float32)

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
        """A compute thread's buffers for chunks of b samples: key (slot, b)."""
        b = key[1]
        (c, h, w), (kh, kw), (f, oh, ow) = self.chw, self.kernel, self.data.shape[1:]
        if self.direct:     # its backward pass's
            return {"acc": self.xp.empty((f, c // self.group, kh, kw, oh, ow), np.float32)}
        s = {"gt": self.xp.empty((f, b, oh, ow), np.float32)}     # W·col, then g, as (F, b, oh, ow)
        g, k = self.group, self._k
        if k <= GW_BY_SAMPLE:
            s["gws_by_sample"] = self.xp.empty((g, b, k, f // g), np.float32)
        if self._cols is None:
            s["col"] = self.xp.empty((c, kh, kw, b, oh, ow), np.float32)
        if self.transposed:
            s["gcol"] = self.xp.empty((f, kh, kw, b, h, w), np.float32)
            s["gx"] = self.xp.empty((c, b, h, w), np.float32)
        return s

    def compute_feature(self, flag, srclayers):
        x = self._input(srclayers)
        forward = self._engine_forward if self.engine else \
            self._direct_forward if self.direct else self._forward
        if self.engine:
            self.engine.weights(self.weight.data, "fwd")
        after = []      # the followers' passes by rows, up to the first that is not one
        for layer, srcs in self.then:
            rows_of = layer.by_rows(flag, srcs)
            if rows_of is None:
                break
            after.append(rows_of)

        def chunk(i, slot):
            forward(x, i, slot)
            for rows_of in after:
                rows_of(self.chunks[i])
        threads.run(chunk, len(self.chunks))
        for layer, _ in self.then[:len(after)]:
            layer.ahead = True

    def _engine_forward(self, x, i, slot):
        rows = self.chunks[i]
        self.engine.forward(self.xp.ascontiguousarray(x[rows]), self.weight.data,
                            None if self.bias is None else self.bias.data, self.data[rows], slot)

    def _direct_forward(self, x, i, slot):
        rows = self.chunks[i]
        self.kernels.group_conv(self.xp.ascontiguousarray(x[rows]), self._w5(),
                                self._zero_bias if self.bias is None else self.bias.data,
                                *self.pad, *self.stride, self.data[rows])

    def _forward(self, x, i, slot):
        rows = self.chunks[i]
        if self.pointwise:
            y = self.data[rows]
            b, f = y.shape[:2]
            np.matmul(self.weight.data, x[rows].reshape(b, self.chw[0], -1),
                      out=y.reshape(b, f, -1))
            if self.bias is not None:
                y += self.bias.data[:, None, None]
            return
        col = self._col(x, i, slot)
        f, b, g = self.data.shape[1], col.shape[3], self.group
        out = self._scratch[slot, b]["gt"]
        _matmul(self._gw(), col.reshape(g, self._k, -1), out.reshape(g, f // g, -1))
        if self.bias is None:
            np.copyto(self.data[rows], out.transpose(1, 0, 2, 3))
        else:
            np.add(out.transpose(1, 0, 2, 3), self.bias.data[:, None, None], out=self.data[rows])

    def _col(self, x, i, slot):
        """Chunk i's col: im2col of its samples, padded, into its kept buffer or the thread's."""
        rows = self.chunks[i]
        b = rows.stop - rows.start
        buf = self._scratch[slot, b]["col"] if self._cols is None else self._cols[i]
        # a group's channels of a cut source are copied out: the loops read planes flat
        return self.kernels.im2col(self.xp.ascontiguousarray(x[rows]), *self.pad, *self.stride,
                                   buf, False)

    def compute_gradient(self, flag, srclayers):
        n, f = self.data.shape[:2]
        if self.bias is not None:
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
        gws, in_place = self._chunks_gw(flag)
        if self.engine and gx is not None:
            self.engine.weights(self.weight.data, "data")
        backward = self._engine_backward if self.engine else \
            self._direct_backward if self.direct else self._backward
        threads.run(lambda i, slot: backward(x, gx, gws, i, slot), len(self.chunks))
        if in_place:
            return      # the one chunk's gW is the weight's gradient
        gw = self.weight.grad if self.direct or self.engine else \
            self.weight.grad.reshape(self.group, f // self.group, -1).transpose(0, 2, 1)
        if flag & job_pb2.kAggGrad:
            gw += gws.sum(axis=0)
        else:
            np.sum(gws, axis=0, out=gw)

    def _chunks_gw(self, flag):
        """(where each chunk's share of gW goes (gW, or gWᵀ as (G, C/G·kh·kw, F/G)), whether
        that is the weight's gradient itself): so for a single chunk written whole (a GPU's
        batch); on the host the calling thread's workspace, which every convolution's backward
        pass there uses in turn (ResNet-50's kept 2.5 times its weights); else a buffer of the
        layer's."""
        f, g = self.data.shape[1], self.group
        shape = (f, self._k) if self.direct or self.engine else (g, self._k, f // g)
        if len(self.chunks) == 1 and (self.direct or self.engine) \
                and not flag & job_pb2.kAggGrad:
            return self.weight.grad.reshape((1,) + shape), True
        if is_host(self.data):
            return threads.workspace("conv gW", (len(self.chunks),) + shape), False
        if self._gws is None:
            self._gws = self.xp.empty((len(self.chunks),) + shape, np.float32)
        return self._gws, False

    def _engine_backward(self, x, gx, gws, i, slot):
        """Chunk i's share of gW into gws[i], and its samples' gx."""
        rows = self.chunks[i]
        gy = self.grad[rows]
        self.engine.backward_weights(self.xp.ascontiguousarray(x[rows]), gy, gws[i], slot)
        if gx is None:
            return
        target = gx[rows]       # not contiguous: a partition's channels of the source's
        out = target if target.flags.c_contiguous else self.xp.empty(target.shape, np.float32)
        self.engine.backward_data(gy, self.weight.data, out, slot)
        if out is not target:
            np.copyto(target, out)

    def _direct_backward(self, x, gx, gws, i, slot):
        """Chunk i's share of gW into gws[i], and its samples' gx."""
        rows = self.chunks[i]
        gy = self.grad[rows]
        b, f = gy.shape[:2]
        s = self._scratch[slot, b]
        self.kernels.group_conv_wgrad(self.xp.ascontiguousarray(x[rows]), gy, *self.pad,
                                      *self.stride, s["acc"])
        np.sum(s["acc"].reshape(f, self._k, -1), axis=2, out=gws[i])
        if gx is None:
            return
        self.kernels.group_conv_xgrad(gy, self._w5(), *self.pad, *self.stride, gx[rows])

    def _backward(self, x, gx, gws, i, slot):
        """Chunk i's share of gWᵀ into gws[i], and its samples' gx."""
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
            np.sum(s["gws_by_sample"], axis=1, out=gws[i])
        else:
            _matmul(col.reshape(g, k, -1), gt.reshape(g, f // g, -1).transpose(0, 2, 1),
                    gws[i])
        if gx is None:
            return
        if self.transposed:
            self._transposed_conv(gt, gx[rows], s)
            return
        # col is no longer needed: reuse it for Wᵀ·g, then scatter back (col2im).
        _matmul(self._gw().transpose(0, 2, 1), gt.reshape(g, f // g, -1), col.reshape(g, k, -1))
        self.kernels.col2im(col, *self.pad, *self.stride, gx[rows])

    def _input(self, srclayers):
        x = srclayers[0].data_for(self).reshape((self.data.shape[0],) + self.src_chw)
        return x if self.chw == self.src_chw else x[:, self.channels]

    def _transposed_conv(self, gt, gx, s):
        """gx (b, C, H, W) = Σ_{f,i,j} Wflip[c,f,i,j]·gpad[f, n, y+i, x+j], gt (F, b, oh, ow);
        f over c's group only."""
        (kh, kw), g = self.kernel, self.group
        gcol = self.kernels.im2col(gt, kh - 1 - self.pad[0], kw - 1 - self.pad[1], 1, 1, s["gcol"],
                                   True)
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
    compute threads; gW sums the chunks' products in chunk order. col2im and im2col are the
    layer's kernels (`kernels.choose`): the same bits on each.
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
        self.grad = self.new_grad()
        self.kernels = kernels.choose(self.device)
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
        y = self.kernels.col2im(col, *self.pad, *self.stride, self.data[rows])
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
        self.kernels.im2col(g, *self.pad, *self.stride, col, False)
        col = col.reshape(self.group, self._gws.shape[3], -1)
        xt = self._xt(x, rows, s)
        _matmul(xt, col.transpose(0, 2, 1), self._gws[i])
        if gx is not None:
            _matmul(self._gw(), col, xt)        # xt is no longer needed: gx as (C, b, H, W)
            np.copyto(gx[rows], s["xt"].transpose(1, 0, 2, 3))


