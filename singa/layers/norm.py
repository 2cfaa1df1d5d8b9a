"""Normalisation layers: LRN, spatial batch normalisation (src/neuralnet/neuron_layer/lrn.cc, cudnn_bm.cc) and Caffe's BatchNorm (src/caffe/layers/batch_norm_layer.cpp)."""
import numpy as np

from singa.device import is_host
from singa.device import threads
from singa.errors import ConfigError
from singa.layers import kernels
from singa.layers.base import Layer, make_params, register
from singa.proto import job_pb2

__all__ = ["LRNLayer", "BMLayer", "CaffeBatchNormLayer", "BN_EPSILON", "sums_scale"]

#: cuDNN's CUDNN_BN_MIN_EPSILON, the epsilon SINGA's CudnnBMLayer passes
BN_EPSILON = 1e-5


def sums_scale(factor):
    """What Caffe's BatchNorm multiplies its running sums by for global statistics: 1/s of
    the factor s, 0 when s is 0, as float32."""
    s = float(factor)
    return np.float32(0 if s == 0 else 1 / s)


def _four_dims(layer, src):
    if src.ndim != 4:
        raise ConfigError(f"layer '{layer.name}' needs a 4-D source (N, C, H, W), got shape "
                          f"{src.shape}")


@register(job_pb2.kLRN, job_pb2.kCudnnLRN)
class LRNLayer(Layer):
    """Across channels, window of n = local_size centred on c (zero outside):
    norm = k + (α/n)·Σ_window x²; y = x·norm^{−β};
    gx = g·norm^{−β} − (2αβ/n)·x·Σ_window(g·y/norm).
    norm_region WITHIN_CHANNEL (ours, Caffe's): the window is n × n pixels centred on (h, w)
    in each channel (zero outside) and α/n becomes α/n² (Caffe's average of the squares,
    padding counted); k = knorm, which Caffe fixes at 1.

    cuDNN's cross-channel LRN computes the same function, so kCudnnLRN is this layer.
    norm^{−β} is exp(−β·ln norm), or 1/(√norm·√√norm) for SINGA's β = 0.75 (a quarter of the
    cost of either power). Chunks of samples run on the compute threads, each one call of the
    layer's kernels (`kernels.choose`): numpy's on the CPU, windows as slices of a padded
    copy; on a GPU a kernel each way (two for the gradient), the same terms in the same
    order.
    """

    capturable = True

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        _four_dims(self, src)
        lc = self.conf.lrn_conf
        self.size = lc.local_size
        if self.size <= 0 or self.size % 2 == 0:
            raise ConfigError(f"layer '{self.name}': lrn_conf.local_size must be odd and "
                              f"positive, got {self.size}")
        self.within = lc.norm_region == job_pb2.LRNProto.WITHIN_CHANNEL
        self.salpha = np.float32(lc.alpha / self.size ** (2 if self.within else 1))
        self.beta = np.float32(lc.beta)
        self.knorm = np.float32(lc.knorm)
        self._coef = -2 * self.beta * self.salpha     # the gradient's −2αβ/n, float32
        self.data = self.xp.zeros(src.shape, np.float32)
        self.grad = self.new_grad()
        self.norm = np.empty_like(self.data)
        self.scale = np.empty_like(self.data)       # norm^{-β}
        self._acc = np.empty_like(self.data)
        self.kernels = kernels.choose(self.device)
        self.chunks = threads.chunks(len(src), 4 * self.data[0].nbytes, is_host(self.data))

    def by_rows(self, flag, srclayers):
        x = srclayers[0].data_for(self)
        return lambda r: self.kernels.lrn(x[r], self.size, self.within, self.salpha,
                                          self.knorm, self.beta, self.data[r], self.norm[r],
                                          self.scale[r])

    def compute_feature(self, flag, srclayers):
        if not self.computed_ahead():
            rows_of = self.by_rows(flag, srclayers)
            threads.run(lambda i, _: rows_of(self.chunks[i]), len(self.chunks))

    def compute_gradient(self, flag, srclayers):
        gsrc = srclayers[0].grad_for(self)
        if gsrc is None:
            return
        x = srclayers[0].data_for(self)

        def backward(i, _):
            r = self.chunks[i]
            self.kernels.lrn_grad(x[r], self.data[r], self.grad[r], self.norm[r], self.scale[r],
                                  self.size, self.within, self._coef, self._acc[r], gsrc[r])
        threads.run(backward, len(self.chunks))


@register(job_pb2.kBM, job_pb2.kCudnnBM)
class BMLayer(Layer):
    """Spatial batch normalisation (cuDNN's, which SINGA's kCudnnBM calls), per channel c over
    (N, H, W): x̂ = (x − μ_c)/√(σ²_c + ε), y = γ_c·x̂ + β_c, ε = 1e-5, μ and σ² (biased) of
    the batch; gγ = Σ g·x̂; gβ = Σ g; gx = γ/(m·√(σ²+ε))·(m·g − Σg − x̂·Σ g·x̂), m = N·H·W.

    Params in conf order, each (1, C, 1, 1): γ (scale), β (bias), and SINGA's running mean
    and inverse variance. Every phase normalises by its own batch's statistics: SINGA keeps
    only the last training batch's as "running" ones (averaging factor 1), and here a small
    param's values come back from its server each step, so the last two params are held
    for the conf and checkpoints only (their gradient is zero).
    """

    capturable = True

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        _four_dims(self, src)
        c = src.shape[1]
        shape = (1, c, 1, 1)
        self.params = make_params(self, {"scale": shape, "bias": shape, "running mean": shape,
                                         "running inverse variance": shape})
        self.gamma, self.beta = self.params[:2]
        self.data = self.xp.zeros(src.shape, np.float32)
        self.grad = self.new_grad()
        self.xhat = np.empty_like(self.data)
        self._tmp = None        # g·x̂ where no source's gradient blob holds it, made once
        self.inv_std = self.xp.empty(shape, np.float32)
        self._m = np.float32(src.size // c)

    def compute_feature(self, flag, srclayers):
        x = srclayers[0].data_for(self)
        axes = (0, 2, 3)
        mean = x.mean(axis=axes, keepdims=True, dtype=np.float64)
        np.subtract(x, mean.astype(np.float32), out=self.xhat)
        # (x − μ)² in `data`, which y overwrites
        var = np.square(self.xhat, out=self.data).mean(axis=axes, keepdims=True, dtype=np.float64)
        np.sqrt(var + BN_EPSILON, out=self.inv_std, casting="same_kind")
        np.reciprocal(self.inv_std, out=self.inv_std)
        self.xhat *= self.inv_std
        np.multiply(self.xhat, self.gamma.data, out=self.data)
        self.data += self.beta.data

    def compute_gradient(self, flag, srclayers):
        axes = (0, 2, 3)
        g = self.grad
        gsrc = srclayers[0].grad_for(self)
        if gsrc is None and self._tmp is None:
            self._tmp = np.empty_like(self.data)
        gbeta = g.sum(axis=axes, keepdims=True)
        # g·x̂ in the source's gradient blob, which gx then overwrites
        ggamma = np.multiply(g, self.xhat, out=self._tmp if gsrc is None else gsrc)\
            .sum(axis=axes, keepdims=True)
        np.copyto(self.beta.grad, gbeta)
        np.copyto(self.gamma.grad, ggamma)
        for p in self.params[2:]:
            p.grad[...] = 0
        if gsrc is None:
            return
        np.multiply(self.xhat, ggamma, out=gsrc)
        gsrc += gbeta
        np.subtract(g * self._m, gsrc, out=gsrc)
        gsrc *= self.gamma.data * self.inv_std / self._m


@register(job_pb2.kCaffeBatchNorm)
class CaffeBatchNormLayer(Layer):
    """Caffe's BatchNorm, per channel c (dim 1) over the others: y = x̂ = (x − μ_c)/√(σ²_c + ε).

    Params in conf order, Caffe's three blobs: running sums S_μ (C), S_σ² (C) and factor
    s (1). Batch statistics (use_global_stats false; unset: in the training phase): μ, σ²
    (biased) of the batch, and then s ← λ·s + 1, S_μ ← λ·S_μ + μ, S_σ² ← λ·S_σ² + m/(m−1)·σ²
    (λ = moving_average_fraction, m = N·H·W); gx = (g − mean(g) − mean(g·y)·y)/√(σ² + ε),
    means over (N, H, W). Global statistics (use_global_stats true; unset: other phases):
    μ = S_μ/s, σ² = S_σ²/s (0 for s = 0); gx = g/√(σ² + ε).
    The three are not learned: the layer updates them (`Param.updated_by_layer`: the worker
    keeps them, never sending them for an update), their lr_scale and wd_scale are forced to
    0 and their gradient is 0; a param without init starts at 0, as Caffe's.
    With global statistics the forward pass writes y straight into `data`, by chunks of samples
    on the compute threads, each one call of the kernels' `normalise`; x̂ is kept apart
    (an in-place successor may change data) only for batch statistics' backward pass, in a
    blob made at the first such forward pass.
    On partition_dim 0 every partition normalises by its share of the batch and partition 0
    alone keeps the sums (the copies share them), as Caffe's root solver.
    """

    capturable = True

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        if src.ndim < 2:
            raise ConfigError(f"layer '{self.name}' needs a source of shape (N, C, ...), got "
                              f"{src.shape}")
        c = src.shape[1]
        self.axes = (0,) + tuple(range(2, src.ndim))
        bshape = (1, c) + (1,) * (src.ndim - 2)
        self.params = make_params(self, {"mean": (c,), "variance": (c,), "factor": (1,)})
        for conf, p in zip(self.conf.param, self.params):
            p.lr_scale = p.wd_scale = 0.0
            p.updated_by_layer = True
            if not conf.HasField("init"):
                p.proto = job_pb2.ParamProto()
                p.proto.CopyFrom(conf)
                p.proto.init.type, p.proto.init.value = job_pb2.kConstant, 0
        self.mean, self.variance, self.factor = self.params
        bc = self.conf.batch_norm_conf
        self.fraction, self.eps = np.float32(bc.moving_average_fraction), bc.eps
        m = src.size // c
        self.correction = np.float32(m / (m - 1) if m > 1 else 1)
        self.keeps_sums = self.conf.partition_id == 0
        self.data = self.xp.zeros(src.shape, np.float32)
        self.grad = self.new_grad()
        self.xhat = None    # batch statistics only (see the docstring)
        self._mu = self.xp.empty(bshape, np.float32)
        self._var = self.xp.empty(bshape, np.float32)
        self.inv_std = self.xp.empty(bshape, np.float32)
        self.global_stats = False
        self.kernels = kernels.choose(self.device)

    def _uses_global_stats(self, flag):
        bc = self.conf.batch_norm_conf
        return bc.use_global_stats if bc.HasField("use_global_stats") \
            else not flag & job_pb2.kTrain

    def by_rows(self, flag, srclayers):
        """With the global statistics: μ and 1/√(σ² + ε) from the sums, then fn(rows)."""
        if not self._uses_global_stats(flag):
            return None
        x = srclayers[0].data_for(self)
        self.global_stats = True
        mu, var = self._mu.reshape(-1), self._var.reshape(-1)
        f = self.factor.data
        # on a GPU 1/s where it lies (a read of s on the host would wait for the GPU)
        if is_host(f):
            s = sums_scale(f[0])
        else:
            zero = f == 0
            s = np.where(zero, np.float32(0), 1 / np.where(zero, np.float32(1), f))
        np.multiply(self.mean.data, s, out=mu)
        np.multiply(self.variance.data, s, out=var)
        self._inv_std()
        return lambda rows: self.kernels.normalise(
            self._by_channel(x[rows]), mu, self.inv_std.reshape(-1),
            self._by_channel(self.data[rows]))

    def compute_feature(self, flag, srclayers):
        if self.computed_ahead():
            return
        x = srclayers[0].data_for(self)
        self.global_stats = self._uses_global_stats(flag)
        if self.global_stats:
            threads.by_samples(self.by_rows(flag, srclayers), x)
            return
        mu, var = self._mu.reshape(-1), self._var.reshape(-1)
        if self.xhat is None:
            self.xhat = np.empty_like(self.data)
        np.copyto(mu, x.mean(axis=self.axes, dtype=np.float64), casting="same_kind")
        np.subtract(x, self._mu, out=self.xhat)
        sq = np.square(self.xhat, out=self.data)     # then y overwrites it
        np.copyto(var, sq.mean(axis=self.axes, dtype=np.float64), casting="same_kind")
        if self.keeps_sums:
            self._accumulate(mu, var)
        self._inv_std()
        self.xhat *= self.inv_std
        np.copyto(self.data, self.xhat)

    @staticmethod
    def _by_channel(x):
        """x (N, C, ...) as (N, C, rest), the kernels' per-channel shape."""
        return x.reshape(x.shape[0], x.shape[1], -1)

    def _inv_std(self):
        """inv_std = 1/√(σ² + ε)."""
        np.add(self._var, np.float32(self.eps), out=self.inv_std)
        np.sqrt(self.inv_std, out=self.inv_std)
        np.reciprocal(self.inv_std, out=self.inv_std)

    def _accumulate(self, mu, var):
        """Caffe's moving sums: s ← λs + 1, S_μ ← λS_μ + μ, S_σ² ← λS_σ² + m/(m−1)·σ²."""
        lam = self.fraction
        self.factor.data *= lam
        self.factor.data += 1
        self.mean.data *= lam
        self.mean.data += mu
        self.variance.data *= lam
        self.variance.data += self.correction * var

    def compute_gradient(self, flag, srclayers):
        for p in self.params:
            p.grad[...] = 0
        gsrc = srclayers[0].grad_for(self)
        if gsrc is None:
            return
        g = self.grad
        if self.global_stats:
            np.multiply(g, self.inv_std, out=gsrc)
            return
        gy = np.multiply(g, self.xhat, out=gsrc).mean(axis=self.axes, keepdims=True)
        np.multiply(self.xhat, gy, out=gsrc)
        gsrc += g.mean(axis=self.axes, keepdims=True)
        np.subtract(g, gsrc, out=gsrc)
        gsrc *= self.inv_std
