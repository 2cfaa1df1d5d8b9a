"""Recurrent layers and their inputs and outputs: CharRNN, OneHot, RNNLabel, RNNDummy, Embedding,
GRU, CharRNNOutput (SINGA 0.3's src/neuralnet/{input,neuron,connection,output}_layer/).

They run in nets unrolled over `unroll_len` (kBPTT, `singa.train.worker.BPTTWorker`): copy i of a
layer is `i#<name>` with `unroll_index` i. A layer fed by a multi-blob source reads blob
`unroll_index` of it (SINGA's `data(k)`), e.g. CharRNN's character indices of step i.
"""
import sys

import numpy as np

from singa import resolve
from singa.device import host
from singa.errors import ConfigError, DataError
from singa.layers.base import Layer, make_params, register
from singa.layers.ops import index_add, sigmoid
from singa.naming import unrolled
from singa.proto import job_pb2

__all__ = ["CharRNNLayer", "OneHotLayer", "RNNLabelLayer", "RNNDummyLayer", "EmbeddingLayer",
           "GRULayer", "CharRNNOutputLayer", "blob"]


def blob(src, dst, k):
    """Blob k of `src` as `dst` reads it (SINGA's `Layer::data(k)`).

    A multi-blob layer (CharRNN) lists its blobs in `datavec`; any other layer has one blob,
    which every k reads.
    """
    vec = getattr(src, "datavec", None)
    if vec is None:
        return src.data_for(dst)
    if not 0 <= k < len(vec):
        raise ConfigError(f"layer '{dst.name}' reads blob {k} of '{src.name}', which has "
                          f"{len(vec)} (blobs 0..{len(vec) - 1})")
    return vec[k]


def read_vocab(path):
    """The bytes of vocab file `path`; character index = position in the file."""
    try:
        with open(path, "rb") as f:
            vocab = f.read()
    except OSError as e:
        raise DataError(f"{path}: cannot read the vocabulary: {e.strerror}") from None
    if not vocab:
        raise DataError(f"{path}: the vocabulary is empty")
    seen = set()
    for i, c in enumerate(vocab):
        if c in seen:
            raise DataError(f"{path}: character {bytes([c])!r} at offset {i} is listed twice "
                            f"(each character once; its index is its position)")
        seen.add(c)
    return vocab


def _indices(layer, src, what, limit):
    """The source blob's values as int indices, each checked to lie in [0, limit)."""
    x = blob(src, layer, layer.unroll_index)
    idx = x.reshape(x.shape[0], -1)[:, 0].astype(np.int64)
    bad = idx[(idx < 0) | (idx >= limit)]
    if bad.size:
        raise DataError(f"layer '{layer.name}': index {bad[0]} from '{src.name}' is outside "
                        f"[0, {limit}) ({what})")
    return idx


@register(job_pb2.kCharRNN)
class CharRNNLayer(Layer):
    """Character indices of a text for `unroll_len` + 1 steps of `batchsize` streams.

    Stream i starts at i·⌊len/batchsize⌋; each call fills blob l (l = 0..unroll_len, shape
    (batchsize,)) with the indices of the characters at start_i + offset + l, then advances
    offset by unroll_len, back to 0 once it reaches ⌊len/batchsize⌋ (positions past the end of
    the text wrap to its start). Blob l feeds unrolled step l; blob l + 1 is its label.
    Index = position of the byte in `vocab_path`. `position`/`seek`: the offset.
    """

    one_to_many = True

    sources = (0, 0)

    def setup(self, srclayers):
        conf = self.conf.char_rnn_conf
        self.batchsize, self.unroll_len = conf.batchsize, conf.unroll_len
        if self.batchsize <= 0 or self.unroll_len <= 0:
            raise ConfigError(f"layer '{self.name}': char_rnn_conf.batchsize and unroll_len must "
                              f"be positive, got {self.batchsize} and {self.unroll_len}")
        for field in ("path", "vocab_path"):
            if not getattr(conf, field):
                raise ConfigError(f"layer '{self.name}': char_rnn_conf.{field} is not set")
        vocab_path, path = resolve(conf.vocab_path), resolve(conf.path)
        table = np.full(256, -1, np.int64)
        vocab = np.frombuffer(read_vocab(vocab_path), np.uint8)
        table[vocab] = np.arange(len(vocab))
        try:
            with open(path, "rb") as f:
                text = np.frombuffer(f.read(), np.uint8)
        except OSError as e:
            raise DataError(f"{path}: cannot read the text: {e.strerror}") from None
        self.text = table[text]
        unknown = np.flatnonzero(self.text < 0)
        if unknown.size:
            i = unknown[0]
            raise DataError(f"{path}: character {bytes([text[i]])!r} at offset {i} is not in "
                            f"{vocab_path}")
        self.max_offset = len(self.text) // self.batchsize
        if self.max_offset <= self.unroll_len:
            raise DataError(f"{path}: {len(self.text)} characters are too few for "
                            f"{self.batchsize} streams of more than {self.unroll_len}")
        self.starts = np.arange(self.batchsize) * self.max_offset
        self.steps = np.arange(self.unroll_len + 1)[:, None]
        self._blobs = self.xp.zeros((self.unroll_len + 1, self.batchsize), np.float32)
        self.datavec = list(self._blobs)
        self.data = self.datavec[0]
        self.offset = 0

    def compute_feature(self, flag, srclayers):
        self._blobs[...] = self.text[(self.starts + self.offset + self.steps) % len(self.text)]
        self.offset += self.unroll_len
        if self.offset >= self.max_offset:
            self.offset = 0

    def position(self):
        """(the text offset of the next call, True): no random skip to remember."""
        return self.offset, True

    def seek(self, offset, skipped):
        self.offset = offset


@register(job_pb2.kOneHot)
class OneHotLayer(Layer):
    """data (N, vocab_size) = one-hot rows of the indices in blob `unroll_index` of the source."""

    one_to_many = True

    def setup(self, srclayers):
        x = blob(srclayers[0], self, self.unroll_index)
        self.dim = self.conf.onehot_conf.vocab_size
        if self.dim <= 0:
            raise ConfigError(f"layer '{self.name}': onehot_conf.vocab_size must be positive")
        self.data = self.xp.zeros((x.shape[0], self.dim), np.float32)
        self._rows = np.arange(x.shape[0])

    def compute_feature(self, flag, srclayers):
        idx = _indices(self, srclayers[0], "onehot_conf.vocab_size", self.dim)
        self.data.fill(0)
        self.data[self._rows, idx] = 1
        self.publish()


@register(job_pb2.kRNNLabel)
class RNNLabelLayer(Layer):
    """aux_data (N,) int32 = the indices in blob `unroll_index` + 1 of the source (the next
    character); a label provider for a loss layer, without data."""

    one_to_many = True

    def setup(self, srclayers):
        x = blob(srclayers[0], self, self.unroll_index + 1)
        self.aux_data = self.xp.zeros(x.shape[0], np.int32)

    def compute_feature(self, flag, srclayers):
        self.aux_data[...] = blob(srclayers[0], self, self.unroll_index + 1)


@register(job_pb2.kRNNDummy)
class RNNDummyLayer(Layer):
    """Without a source: data of rnn_dummy_conf.shape drawn from U[low, high) (floored if
    `integer`); with one: the source's data. A BPTT test net feeds it, from its second step on,
    the layer `<unroll_index>#<dynamic_srclayer>` (e.g. the previous sample's argsort)."""

    sources = (0, 1)

    def setup(self, srclayers):
        conf = self.conf.rnn_dummy_conf
        name = conf.dynamic_srclayer
        self.dynamic_srclayer = unrolled(name, self.unroll_index) if name else None
        if srclayers:
            self.data = srclayers[0].data_for(self)
            return
        if not conf.shape or min(conf.shape) <= 0 or conf.low >= conf.high:
            raise ConfigError(f"layer '{self.name}': without a srclayer, rnn_dummy_conf needs "
                              f"a positive shape and low < high, got shape {list(conf.shape)}, "
                              f"low {conf.low:g}, high {conf.high:g}")
        self.low, self.high, self.integer = conf.low, conf.high, conf.integer
        self.data = self.xp.zeros(tuple(conf.shape), np.float32)

    def compute_feature(self, flag, srclayers):
        if srclayers:
            self.data = srclayers[0].data_for(self)
            return
        self.data = self.device.put(
            np.asarray(self.rng.uniform(self.low, self.high, self.data.shape), np.float32))
        if self.integer:
            np.floor(self.data, out=self.data)


@register(job_pb2.kEmbedding)
class EmbeddingLayer(Layer):
    """y[n] = W[idx_n], idx from blob `unroll_index` of the source; W (vocab_size, feature_dim);
    gW[v] = Σ_{n: idx_n = v} g[n] (added to gW with kAggGrad)."""

    backward_to = ()     # its source gives indices

    def setup(self, srclayers):
        x = blob(srclayers[0], self, self.unroll_index)
        conf = self.conf.embedding_conf
        self.vocab_size, dim = conf.vocab_size, conf.feature_dim
        if self.vocab_size <= 0 or dim <= 0:
            raise ConfigError(f"layer '{self.name}': embedding_conf.vocab_size and feature_dim "
                              f"must be positive, got {self.vocab_size} and {dim}")
        self.weight, = self.params = make_params(self, {"weight": (self.vocab_size, dim)})
        self.data = self.xp.zeros((x.shape[0], dim), np.float32)
        self.grad = np.zeros_like(self.data)

    def compute_feature(self, flag, srclayers):
        self.idx = self.device.put(
            _indices(self, srclayers[0], "embedding_conf.vocab_size", self.vocab_size))
        np.take(self.weight.data, self.idx, axis=0, out=self.data)

    def compute_gradient(self, flag, srclayers):
        if not flag & job_pb2.kAggGrad:
            self.weight.grad.fill(0)
        index_add(self.weight.grad, self.idx, self.grad)


@register(job_pb2.kGRU)
class GRULayer(Layer):
    """Gated recurrent unit; sources [x (N, D)] or [x, h⁻ (N, H)] (h⁻ = 0 without the second):

        z = σ(x·W_zxᵀ + b_z + h⁻·W_zhᵀ)        r = σ(x·W_rxᵀ + b_r + h⁻·W_rhᵀ)
        c = tanh(r ⊙ (h⁻·W_chᵀ) + x·W_cxᵀ + b_c)        h = z ⊙ (h⁻ − c) + c

    Params in conf order: W_zx, W_rx, W_cx (H, D), W_zh, W_rh, W_ch (H, H), then b_z, b_r, b_c
    (H) when the conf lists more than 6. Backward, with g = dL/dh:
    dz = g ⊙ (h⁻ − c) ⊙ z(1 − z), dc = g ⊙ (1 − z) ⊙ (1 − c²), dr = dc ⊙ (h⁻·W_chᵀ) ⊙ r(1 − r);
    gW_·x = d·ᵀ x, gW_zh = dzᵀ h⁻, gW_rh = drᵀ h⁻, gW_ch = (dc ⊙ r)ᵀ h⁻, gb_· = Σ_n d·;
    dx = dz·W_zx + dr·W_rx + dc·W_cx; dh⁻ = g ⊙ z + dz·W_zh + dr·W_rh + (dc ⊙ r)·W_ch.
    Param grads are added with kAggGrad. (SINGA 0.3 adds z instead of g ⊙ z to dh⁻.)
    """

    sources = (1, 2)

    def setup(self, srclayers):
        x = srclayers[0].data_for(self)
        n, h = x.shape[0], self.conf.gru_conf.dim_hidden
        self.batchsize, self.vdim, self.hdim = n, x.size // n, h
        shapes = {f"W_{g}x": (h, self.vdim) for g in "zrc"}
        shapes.update({f"W_{g}h": (h, h) for g in "zrc"})
        if len(self.conf.param) > 6:
            shapes.update({f"b_{g}": (h,) for g in "zrc"})
        self.params = make_params(self, shapes)
        self.wx, self.wh = self.params[0:3], self.params[3:6]
        self.bias = self.params[6:9]
        if len(srclayers) == 2 and srclayers[1].data_for(self).shape != (n, h):
            raise ConfigError(f"layer '{self.name}': state source '{srclayers[1].name}' has shape "
                              f"{srclayers[1].data_for(self).shape}, expected {(n, h)}")
        self.data = self.xp.zeros((n, h), np.float32)
        self.grad = np.zeros_like(self.data)
        self.zeros = np.zeros_like(self.data)
        self.z, self.r, self.c, self.hc = (np.zeros_like(self.data) for _ in range(4))
        self._d = [np.zeros_like(self.data) for _ in range(3)]   # dz, dr, dc ⊙ r
        self._dc = np.zeros_like(self.data)
        self._t = np.zeros_like(self.data)

    def _state(self, srclayers):
        return srclayers[1].data_for(self) if len(srclayers) == 2 else self.zeros

    def _gate(self, out, k, x, hprev, act):
        """out = act(x·W_kxᵀ + b_k + h⁻·W_khᵀ)."""
        np.dot(x, self.wx[k].data.T, out=out)
        if self.bias:
            out += self.bias[k].data
        np.dot(hprev, self.wh[k].data.T, out=self._t)
        out += self._t
        act(out, out)

    def compute_feature(self, flag, srclayers):
        x = srclayers[0].data_for(self).reshape(self.batchsize, self.vdim)
        hprev = self._state(srclayers)
        z, r, c = self.z, self.r, self.c
        self._gate(z, 0, x, hprev, sigmoid)
        self._gate(r, 1, x, hprev, sigmoid)
        np.dot(hprev, self.wh[2].data.T, out=self.hc)
        np.multiply(r, self.hc, out=c)
        np.dot(x, self.wx[2].data.T, out=self._t)
        c += self._t
        if self.bias:
            c += self.bias[2].data
        np.tanh(c, out=c)
        # h may be h⁻ itself (a sampling net feeds a GRU its own last state): elementwise only
        np.subtract(hprev, c, out=self.data)
        self.data *= z
        self.data += c

    def compute_gradient(self, flag, srclayers):
        x = srclayers[0].data_for(self).reshape(self.batchsize, self.vdim)
        hprev = self._state(srclayers)
        g, z, r, c = self.grad, self.z, self.r, self.c
        dz, dr, dcr = self._d
        dc, t = self._dc, self._t
        np.subtract(hprev, c, out=dz)                   # dz = g(h⁻ − c)·z(1 − z)
        dz *= g
        np.subtract(1, z, out=t)
        t *= z
        dz *= t
        np.subtract(1, z, out=dc)                       # dc = g(1 − z)(1 − c²)
        dc *= g
        np.multiply(c, c, out=t)
        np.subtract(1, t, out=t)
        dc *= t
        np.multiply(dc, self.hc, out=dr)                # dr = dc·(h⁻W_chᵀ)·r(1 − r)
        np.subtract(1, r, out=t)
        t *= r
        dr *= t
        np.multiply(dc, r, out=dcr)
        agg = flag & job_pb2.kAggGrad
        for d_x, d_h, wx, wh, b in zip((dz, dr, dc), (dz, dr, dcr), self.wx, self.wh,
                                       self.bias or (None,) * 3):
            _write(wx.grad, np.dot(d_x.T, x), agg)
            _write(wh.grad, np.dot(d_h.T, hprev), agg)
            if b is not None:
                _write(b.grad, d_x.sum(axis=0), agg)
        gx = srclayers[0].grad_for(self)
        if gx is not None:
            gx = gx.reshape(self.batchsize, self.vdim)
            np.dot(dz, self.wx[0].data, out=gx)
            gx += np.dot(dr, self.wx[1].data)
            gx += np.dot(dc, self.wx[2].data)
        gh = srclayers[1].grad_for(self) if len(srclayers) == 2 else None
        if gh is not None:
            np.multiply(g, z, out=gh)
            for d, w in zip(self._d, self.wh):
                gh += np.dot(d, w.data)


def _write(grad, value, add):
    if add:
        grad += value
    else:
        grad[...] = value


@register(job_pb2.kCharRNNOutput)
class CharRNNOutputLayer(Layer):
    """Prints vocab[x_i] to stdout for the first N values x_i of the source, N its rows (SINGA's
    `vocab_[dptr[i]]`): after an ArgSort of topk 1, the sampled characters."""

    sources = (1, 1)

    def setup(self, srclayers):
        path = self.conf.char_rnn_conf.vocab_path
        if not path:
            raise ConfigError(f"layer '{self.name}': char_rnn_conf.vocab_path is not set")
        self.vocab = read_vocab(resolve(path))

    def compute_feature(self, flag, srclayers):
        x = host(srclayers[0].data_for(self))
        idx = x.reshape(-1)[:x.shape[0]].astype(np.int64)
        bad = idx[(idx < 0) | (idx >= len(self.vocab))]
        if bad.size:
            raise DataError(f"layer '{self.name}': index {bad[0]} is outside the "
                            f"{len(self.vocab)} characters of its vocab_path")
        sys.stdout.buffer.write(bytes(self.vocab[i] for i in idx))
        sys.stdout.buffer.flush()
