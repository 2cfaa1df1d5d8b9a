"""Loss layers: SoftmaxLoss and EuclideanLoss (src/neuralnet/loss_layer/) and ours, MSELoss (Keras' mean squared error); their loss (and accuracy, mae) are metrics."""
import numpy as np

from singa.device import is_host
from singa.errors import ConfigError, DataError
from singa.layers import kernels
from singa.layers.base import Layer, register
from singa.layers.ops import softmax
from singa.proto import job_pb2

__all__ = ["SoftmaxLossLayer", "CudnnSoftmaxLossLayer", "EuclideanLossLayer", "MSELossLayer"]

FLT_MIN = np.finfo(np.float32).tiny


@register(job_pb2.kSoftmaxLoss)
class SoftmaxLossLayer(Layer):
    """p = softmax(x) per row; loss = scale·mean_n −log(max(p[label_n], FLT_MIN));
    accuracy = scale·mean_n [label_n ∈ top-k of p]; gx = (p − onehot(label))·scale/N.

    Sources: [scores, label provider (its aux_data)]. `data` holds p; metrics `Loss` and
    `accuracy` (only `Loss` for the cuDNN layer). On a GPU the kernel adds each batch's to
    the sums kept on the device (`keep_metrics_on_device`): a step is device work alone, but
    for the labels' check (`prepare`).
    """

    capturable = True

    backward_to = (0,)     # not the labels' or targets' source
    sources = (2, 2)

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        if srclayers[1].targets is not None:
            raise ConfigError(f"layer '{self.name}': source '{srclayers[1].name}' gives "
                              f"regression targets (store_conf.target_dim), not class labels")
        n = src.shape[0]
        self.data = self.xp.zeros((n, src.size // n), np.float32)
        self.topk = self.conf.softmaxloss_conf.topk
        self.scale = self.conf.softmaxloss_conf.scale
        self.kernels = kernels.choose(self.device)
        # A GPU's kernels (forward: 2 launches; gradient: 1) add each batch's metrics to sums
        # kept there; the host sums floats (`add_metrics`), computed here in numpy's calls.
        self.metrics_on_device = self.device.gpu is not None
        if self.metrics_on_device:
            self._row_loss = self.xp.empty(n, np.float64)
            self._hit = self.xp.empty(n, np.int32)
            self.keep_metrics_on_device(("Loss", "accuracy"))    # the kernel adds to them
        else:
            self._rowmax = self.xp.empty((n, 1), np.float32)
            self._rows = self.xp.arange(n)
            self._cols = self.xp.arange(self.data.shape[1])

    def _labels(self, srclayers):
        """ConfigError or DataError unless the label source gives a label in [0, D) for each
        sample of the batch."""
        labels = srclayers[1].aux_data
        n, dim = self.data.shape
        if labels is None or len(labels) != n:
            raise ConfigError(f"layer '{self.name}': source '{srclayers[1].name}' gives no "
                              f"labels for a batch of {n}")
        bad = labels[(labels < 0) | (labels >= dim)]
        if bad.size:
            raise DataError(f"layer '{self.name}': label {bad[0]} from source "
                            f"'{srclayers[1].name}' is outside [0, {dim})")

    def prepare(self, flag, srclayers):
        """Forward: the labels' check, before a kernel reads them."""
        if flag & job_pb2.kForward:
            self._labels(srclayers)

    def compute_feature(self, flag, srclayers):
        self.prepare(flag, srclayers)
        x = srclayers[0].data_for(self)
        p = self.data
        labels = self.device.put(srclayers[1].labels_for(self))
        if self.metrics_on_device:
            self.kernels.softmax_loss(x.reshape(p.shape), labels, self.topk, self.scale, p,
                                      self._row_loss, self._hit, self.metric_store)
            return
        softmax(x.reshape(p.shape), p, self._rowmax)
        truth = p[self._rows, labels]
        loss = -np.log(np.maximum(truth, FLT_MIN), dtype=np.float64).sum()
        # SINGA ranks (p, index) pairs descending: among equal p the higher index first.
        above = (p > truth[:, None]) | ((p == truth[:, None]) & (self._cols > labels[:, None]))
        hits = np.count_nonzero(above.sum(axis=1) < self.topk)
        n = p.shape[0]
        metrics = {"Loss": self.scale * loss / n, "accuracy": self.scale * hits / n}
        self.add_metrics({k: metrics[k] for k in self.shown})

    def compute_gradient(self, flag, srclayers):
        gsrc = srclayers[0].grad_for(self)
        if gsrc is None:
            return
        g = gsrc.reshape(self.data.shape)
        labels = self.device.put(srclayers[1].labels_for(self))
        scale = np.float32(self.scale) / np.float32(g.shape[0])
        self.kernels.softmax_loss_grad(self.data, labels, scale, g)

    def metrics(self, flag):
        """Those `shown` (a GPU sums the accuracy of the cuDNN layer too)."""
        return {k: v for k, v in super().metrics(flag).items() if k in self.shown}

    #: the metrics shown, in order
    shown = ("Loss", "accuracy")
    METRICS = ("loss", "accuracy")


@register(job_pb2.kCudnnSoftmaxLoss)
class CudnnSoftmaxLossLayer(SoftmaxLossLayer):
    """SoftmaxLoss as SINGA's cuDNN layer computes it: no scale; displays only `Loss = %f`."""

    capturable = True

    shown = ("Loss",)
    METRICS = ("loss",)

    def setup(self, srclayers):
        super().setup(srclayers)
        self.scale = 1.0


@register(job_pb2.kEuclideanLoss)
class EuclideanLossLayer(Layer):
    """loss = Σ(t − r)²/N (no ½); gr = (r − t)/N, SINGA's gradient (that of ½·loss).

    Sources: [reconstruction r, target t (its data)]. On a GPU its loss is summed on the
    device (`keep_metrics_on_device`).
    """
    METRICS = ("loss",)

    capturable = True

    backward_to = (0,)     # not the labels' or targets' source
    sources = (2, 2)

    def setup(self, srclayers):
        r, t = srclayers[0].data_for(self), srclayers[1].data_for(self)
        if r.size != t.size:
            raise ConfigError(f"layer '{self.name}': reconstruction '{srclayers[0].name}' has "
                              f"shape {r.shape} but target '{srclayers[1].name}' has {t.shape}")
        self._diff = self.xp.empty(r.shape, np.float32)
        if not is_host(self._diff):
            self.keep_metrics_on_device(("Loss",))

    def compute_feature(self, flag, srclayers):
        r, t = srclayers[0].data_for(self), srclayers[1].data_for(self)
        d = self._diff
        np.subtract(r, t.reshape(r.shape), out=d)
        self.add_metrics({"Loss": np.dot(d.ravel(), d.ravel()).astype(np.float64) / d.shape[0]})

    def compute_gradient(self, flag, srclayers):
        gsrc = srclayers[0].grad_for(self)
        if gsrc is not None:
            d = self._diff
            np.divide(d, np.float32(d.shape[0]), out=gsrc.reshape(d.shape))


@register(job_pb2.kMSELoss)
class MSELossLayer(Layer):
    """Keras' mean squared error of predictions p against regression targets t, both (N, K):
    loss = mean_n mean_k (p − t)²; mae = mean_n mean_k |p − t|; gp = 2(p − t)/(N·K).

    Sources: [prediction p, target provider (its `targets`: an input layer's store_conf has
    target_dim K)]. kEuclideanLoss is SINGA's reconstruction instead: Σ_k over the outputs, the
    input itself as the target, and the gradient of half of it. On a GPU its metrics are summed
    on the device (`keep_metrics_on_device`).
    """
    METRICS = ("loss", "mae")

    capturable = True

    backward_to = (0,)     # not the labels' or targets' source
    sources = (2, 2)

    def setup(self, srclayers):
        p, provider = srclayers[0].data_for(self), srclayers[1]
        if provider.targets is None:
            raise ConfigError(f"layer '{self.name}': source '{provider.name}' gives no "
                              f"regression targets (store_conf.target_dim): give y (floats), or "
                              f"compile with loss='reconstruction' to compare with the input")
        n = p.shape[0]
        if provider.targets.shape != (n, p.size // n):
            raise ConfigError(f"layer '{self.name}': prediction '{srclayers[0].name}' has shape "
                              f"{p.shape} but source '{provider.name}' gives targets of shape "
                              f"{provider.targets.shape}")
        self._diff = self.xp.empty(provider.targets.shape, np.float32)
        self._abs = self.xp.empty(provider.targets.shape, np.float32)
        if not is_host(self._diff):
            self.keep_metrics_on_device(("Loss", "mae"))

    def compute_feature(self, flag, srclayers):
        d = self._diff
        np.subtract(srclayers[0].data_for(self).reshape(d.shape),
                    srclayers[1].targets_for(self), out=d)
        flat = d.ravel()
        np.abs(flat, out=self._abs.ravel())
        self.add_metrics({"Loss": np.dot(flat, flat).astype(np.float64) / d.size,
                          "mae": self._abs.sum(dtype=np.float64) / d.size})

    def compute_gradient(self, flag, srclayers):
        gsrc = srclayers[0].grad_for(self)
        if gsrc is not None:
            d = self._diff
            np.multiply(d, np.float32(2 / d.size), out=gsrc.reshape(d.shape))
