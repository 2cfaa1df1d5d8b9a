"""RBM layers trained by contrastive divergence: RBMVis and RBMHid (src/neuralnet/neuron_layer/rbm.cc, CDWorker in src/worker.cc).

An RBM is a pair of layers joined by a bidirectional edge: RBMVis (sources: the data, i.e. an
input layer or a lower Sigmoid, and RBMHid) and RBMHid (source: RBMVis), sharing the weight
W (hdim, vdim) through `share_from`. Flags: kPositive computes from the data, kNegative runs a
Gibbs step from the current hidden sample, kTest (with kNegative) adds the reconstruction error.
+ marks the positive phase, − the negative one:
    h+ = σ(v+ Wᵀ + b_hid)              (no σ with rbm_conf.gaussian)
    v− = σ(sample(h) W + b_vis),       h− = σ(v− Wᵀ + b_hid)
    sample(h) = [U < h] (binary) or h + N(0, 1) (gaussian)
    gW = (h−ᵀ v− − h+ᵀ v+)/N,  gb_vis = (Σv− − Σv+)/N,  gb_hid = (Σh− − Σh+)/N
These are descent directions: the updater subtracts them.
"""
import numpy as np

from singa.device import threads
from singa.errors import ConfigError
from singa.layers.base import Layer, make_params, register
from singa.layers.ops import sigmoid
from singa.proto import job_pb2

__all__ = ["RBMVisLayer", "RBMHidLayer"]

kPositive, kNegative, kTest = job_pb2.kPositive, job_pb2.kNegative, job_pb2.kTest


@register(job_pb2.kRBMVis)
class RBMVisLayer(Layer):
    """Visible units: v+ is a copy of the data, v− the reconstruction; params W, b_vis.

    Metric `Squared Error`: the sum of Σ(v+ − v−)²/N over kNegative|kTest passes divided by the
    number of compute_feature calls (SINGA's counter counts every call, so with cd_k 1 the
    figure is half the per-batch squared error).
    """

    backward_to = ()     # kCD: no gradient goes to a source
    METRICS = ("squared error",)

    def setup(self, srclayers):
        hids = [s for s in srclayers if isinstance(s, RBMHidLayer)]
        if len(srclayers) != 2 or len(hids) != 1:
            raise ConfigError(f"layer '{self.name}': kRBMVis needs two srclayers, the data and "
                              f"its kRBMHid layer; got {[s.name for s in srclayers]}")
        self.hid = hids[0]
        self.input = srclayers[0] if srclayers[1] is self.hid else srclayers[1]
        src = self.input.data_for(self)
        n = src.shape[0]
        self.batchsize, self.vdim = n, src.size // n
        self.hdim = self.conf.rbm_conf.hdim
        self.weight, self.bias = self.params = make_params(
            self, {"weight": (self.hdim, self.vdim), "bias": (self.vdim,)})
        self.pos_data = self.xp.zeros((n, self.vdim), np.float32)
        self.neg_data = np.zeros_like(self.pos_data)
        self._diff = np.empty_like(self.pos_data)
        self._gw = self.xp.empty((self.hdim, self.vdim), np.float32)
        self.data = self.pos_data

    def compute_feature(self, flag, srclayers):
        error = 0.0
        if flag & kPositive:
            np.copyto(self.pos_data, self.input.data_for(self).reshape(self.pos_data.shape))
        elif flag & kNegative:
            v = self.neg_data
            threads.matmul(self.hid.sample(flag), self.weight.data, v)
            v += self.bias.data
            sigmoid(v, v)
            if flag & kTest:
                d = np.subtract(self.pos_data, v, out=self._diff).ravel()
                error = np.dot(d, d).astype(np.float64) / self.batchsize
        self.add_metrics({"Squared Error": error})

    def compute_gradient(self, flag, srclayers):
        n = np.float32(self.batchsize)
        vp, vn, hp, hn = self.pos_data, self.neg_data, self.hid.pos_data, self.hid.neg_data
        gb = self.bias.grad
        np.sum(vn, axis=0, out=gb)
        gb -= vp.sum(axis=0)
        gb /= n
        gw = self.weight.grad
        threads.matmul(hn.T, vn, gw)
        gw -= threads.matmul(hp.T, vp, self._gw)
        gw /= n


@register(job_pb2.kRBMHid)
class RBMHidLayer(Layer):
    """Hidden units: h+ from v+, h− from v− (probabilities, or pre-activations if gaussian);
    params W (shared from the Vis layer's), b_hid."""

    backward_to = ()     # kCD: no gradient goes to a source

    def setup(self, srclayers):
        if len(srclayers) != 1 or not isinstance(srclayers[0], RBMVisLayer):
            raise ConfigError(f"layer '{self.name}': kRBMHid needs one srclayer, its kRBMVis "
                              f"layer; got {[s.name for s in srclayers]}")
        self.vis = srclayers[0]
        src = self.vis.data_for(self)
        n = src.shape[0]
        self.batchsize, self.vdim = n, src.size // n
        self.hdim = self.conf.rbm_conf.hdim
        self.gaussian = self.conf.rbm_conf.gaussian
        self.weight, self.bias = self.params = make_params(
            self, {"weight": (self.hdim, self.vdim), "bias": (self.hdim,)})
        self.pos_data = self.xp.zeros((n, self.hdim), np.float32)
        self.neg_data = np.zeros_like(self.pos_data)
        self.pos_sample = np.zeros_like(self.pos_data)
        self.neg_sample = np.zeros_like(self.pos_data)
        self._uniform = np.empty_like(self.pos_data)
        self.data = self.pos_data
        # The first Gibbs step samples h+; later ones sample h− (SINGA's first_gibbs_).
        self.first_gibbs = True

    def compute_feature(self, flag, srclayers):
        if flag & kPositive:
            v, h = self.vis.pos_data, self.pos_data
            self.first_gibbs = True
        else:
            # Hinton's recipe: h− is computed from the reconstruction's probabilities, unsampled.
            v, h = self.vis.neg_data, self.neg_data
            self.first_gibbs = False
        threads.matmul(v, self.weight.data.T, h)
        h += self.bias.data
        if not self.gaussian:
            sigmoid(h, h)

    def sample(self, flag):
        """A sample of h+ (kPositive or first Gibbs step) or else of h−, drawn from `rng`."""
        if flag & kPositive or self.first_gibbs:
            h, out = self.pos_data, self.pos_sample
        else:
            h, out = self.neg_data, self.neg_sample
        if self.gaussian:
            self.draw(out, "standard_normal")
            out += h
        else:
            self.draw(self._uniform)
            np.less(self._uniform, h, out=out)
        return out

    def compute_gradient(self, flag, srclayers):
        n = np.float32(self.batchsize)
        gb = self.bias.grad
        np.sum(self.neg_data, axis=0, out=gb)
        gb -= self.pos_data.sum(axis=0)
        gb /= n
        # W's gradient is the Vis layer's; this share of W adds zero when the stub sums shares.
        self.weight.grad[...] = 0
