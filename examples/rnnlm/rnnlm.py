"""User layers of SINGA's rnnlm example (examples/rnnlm/rnnlm.cc): Mikolov's RNN language model
with a class-factored softmax, trained with kBP; BPTT runs inside the Hidden layer over a window.

Registered for `user_type` kData, kEmbedding, kHidden and kLoss (and kLabel, which SINGA 0.1's
job-v0.1.0.conf puts between the data and the loss); their conf fields come from
rnnlm.proto (`[data_conf]`, `[embedding_conf]`, `[loss_conf]`). Load both with

    bin/singa-run.sh -conf examples/rnnlm/job.conf \\
        -user_proto examples/rnnlm/rnnlm.proto -user_layers examples/rnnlm/rnnlm.py

Rows of the data blob are words: [word_index, class_index, class_start, class_end]; row 0 is
the last word of the previous window, rows 1..window the words read, so row t + 1 is the word
that follows row t. Each layer takes `window` from its source (SINGA's RNNLayer::window) and
uses rows t < window only; the rest are stale.
"""
import os

import numpy as np

from singa import resolve
from singa.errors import ConfigError, DataError
from singa.extensions import load_proto
from singa.io.store import open_store, read_cyclic
from singa.layers.base import Layer, make_params, register

rnnlm = load_proto(os.path.join(os.path.dirname(os.path.abspath(__file__)), "rnnlm.proto"))

FLT_MIN = np.finfo(np.float32).tiny


@register("kData")
class DataLayer(Layer):
    """Reads WordRecords until a sentence ends (word_index 0, "</s>") or max_window words are
    read; `window` = the number read. data (max_window + 1, 4); wraps at the store's end."""

    one_to_many = True
    sources = (0, 0)
    METRICS = ()    # none: the conf check of checkpoint_keep_best then knows every name

    def setup(self, srclayers):
        conf = self.conf.Extensions[rnnlm.data_conf]
        self.max_window = conf.max_window
        if self.max_window <= 0:
            raise ConfigError(f"layer '{self.name}': [data_conf] max_window must be positive")
        self.path, self.backend = resolve(conf.path), conf.backend
        self.data = np.zeros((self.max_window + 1, 4), np.float32)
        self.window = 0
        self.store = None

    def compute_feature(self, flag, srclayers):
        if self.store is None:
            self.store = open_store(self.backend, self.path, "read")
            self._set(0, self._next())
        self.data[0] = self.data[self.window]
        self.window = self.max_window
        for i in range(1, self.max_window + 1):
            word = self._next()
            self._set(i, word)
            if word.word_index == 0:
                self.window = i
                break

    def _set(self, row, word):
        self.data[row] = (word.word_index, word.class_index, word.class_start, word.class_end)

    def _next(self):
        return rnnlm.WordRecord.FromString(read_cyclic(self.store, self.path, self.backend)[1])


@register("kEmbedding")
class EmbeddingLayer(Layer):
    """data[t] = W[word_index of row t] for t < window; W (vocab_size, word_dim);
    gW[v] = Σ_{t: word t is v} g[t]."""

    METRICS = ()

    def setup(self, srclayers):
        self.source = srclayers[0]
        conf = self.conf.Extensions[rnnlm.embedding_conf]
        self.vocab_size = conf.vocab_size
        rows = self.source.data_for(self).shape[0]
        self.weight, = self.params = make_params(self, {"weight": (self.vocab_size, conf.word_dim)})
        self.data = np.zeros((rows, conf.word_dim), np.float32)
        self.grad = np.zeros_like(self.data)

    def compute_feature(self, flag, srclayers):
        self.window = w = self.source.window
        self.idx = self.source.data_for(self)[:w, 0].astype(np.int64)
        if self.idx.size and (self.idx.min() < 0 or self.idx.max() >= self.vocab_size):
            raise DataError(f"layer '{self.name}': a word index is outside [0, "
                            f"{self.vocab_size}) ([embedding_conf] vocab_size)")
        self.data[:w] = self.weight.data[self.idx]

    def compute_gradient(self, flag, srclayers):
        self.weight.grad.fill(0)
        np.add.at(self.weight.grad, self.idx, self.grad[:len(self.idx)])


@register("kHidden")
class HiddenLayer(Layer):
    """h[0] = σ(x[0]), h[t] = σ(h[t−1]·W + x[t]) for t < window; W (dim, dim). Backward through
    the window: d[t] = (g[t] + d[t+1]·Wᵀ) ⊙ h[t](1 − h[t]); gW = Σ_t h[t−1]ᵀ d[t]; gx = d."""

    METRICS = ()

    def setup(self, srclayers):
        self.source = srclayers[0]
        x = self.source.data_for(self)
        self.weight, = self.params = make_params(self, {"weight": (x.shape[1], x.shape[1])})
        self.data = np.zeros_like(x)
        self.grad = np.zeros_like(x)

    def compute_feature(self, flag, srclayers):
        x, h = self.source.data_for(self), self.data
        self.window = self.source.window
        for t in range(self.window):
            h[t] = x[t] if t == 0 else h[t - 1] @ self.weight.data + x[t]
            h[t] = 1 / (1 + np.exp(-h[t]))

    def compute_gradient(self, flag, srclayers):
        w, h = self.window, self.data
        d = np.zeros_like(self.grad)
        for t in range(w - 1, -1, -1):
            d[t] = self.grad[t] + (d[t + 1] @ self.weight.data.T if t < w - 1 else 0)
            d[t] *= h[t] * (1 - h[t])
        self.weight.grad[...] = h[:w - 1].T @ d[1:w]
        gx = self.source.grad_for(self)
        if gx is not None:
            gx[...] = d


@register("kLoss")
class LossLayer(Layer):
    """Class-factored softmax over sources [hidden h, data]: for t < window, with the next word
    (row t + 1: word v in class k, class words [start, end)),
    p = softmax(h[t]·W_word[start:end]ᵀ)[v − start] · softmax(h[t]·W_classᵀ)[k];
    loss += −ln max(p, FLT_MIN). Params W_word (vocab_size, dim), W_class (nclass, dim).
    Metrics: `loss` = mean per word, `ppl` = 10^(−mean log10 p), since the last display."""
    METRICS = ("loss", "ppl")

    def setup(self, srclayers):
        if len(srclayers) != 2:
            raise ConfigError(f"layer '{self.name}' needs 2 srclayers (hidden, data), got "
                              f"{len(srclayers)}")
        self.source, self.labels = srclayers
        conf = self.conf.Extensions[rnnlm.loss_conf]
        dim = self.source.data_for(self).shape[1]
        self.word_weight, self.class_weight = self.params = make_params(
            self, {"word_weight": (conf.vocab_size, dim), "class_weight": (conf.nclass, dim)})

    def compute_feature(self, flag, srclayers):
        h, rows = self.source.data_for(self), self.labels.data_for(self)
        self.steps = []
        loss = log10p = 0.0
        for t in range(self.source.window):
            wid, cid, start, end = (int(v) for v in rows[t + 1])
            if not start <= wid < end <= len(self.word_weight.data) or \
                    not 0 <= cid < len(self.class_weight.data):
                raise DataError(f"layer '{self.name}': word {wid} of class {cid} [{start}, {end}) "
                                f"does not fit [loss_conf] vocab_size / nclass")
            pword = _softmax(self.word_weight.data[start:end] @ h[t])
            pclass = _softmax(self.class_weight.data @ h[t])
            p = max(float(pword[wid - start] * pclass[cid]), FLT_MIN)
            loss -= np.log(p)
            log10p += np.log10(p)
            self.steps.append((wid - start, cid, start, end, pword, pclass))
        self.add_metrics({"loss": loss, "log10p": log10p}, len(self.steps))

    def compute_gradient(self, flag, srclayers):
        h, gh = self.source.data_for(self), self.source.grad_for(self)
        gword, gclass = self.word_weight.grad, self.class_weight.grad
        gword.fill(0)
        gclass.fill(0)
        gh[len(self.steps):] = 0
        for t, (v, k, start, end, pword, pclass) in enumerate(self.steps):
            dword, dclass = pword.copy(), pclass.copy()
            dword[v] -= 1
            dclass[k] -= 1
            gword[start:end] += np.outer(dword, h[t])
            gclass += np.outer(dclass, h[t])
            gh[t] = dword @ self.word_weight.data[start:end] + dclass @ self.class_weight.data

    def metrics(self, flag):
        """{"loss": mean −ln p, "ppl": 10^(−mean log10 p)} per word since the last call."""
        means = super().metrics(flag)
        if means:
            means["ppl"] = 10 ** -means.pop("log10p")
        return means


@register("kLabel")
class LabelLayer(Layer):
    """SINGA 0.1's rnnlm label layer: its source's word rows, unchanged (it aliases them)."""

    METRICS = ()

    def setup(self, srclayers):
        self.data = srclayers[0].data_for(self)

    def compute_feature(self, flag, srclayers):
        pass


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()
