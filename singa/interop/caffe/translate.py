"""Caffe layers → SINGA JobProto layers, with each param's values taken from the weights.

Caffe nets are graphs of blobs: a layer reads bottom blobs and writes top blobs, and ReLU,
Dropout, BatchNorm or Scale often write their input blob in place. A SINGA net is a graph of
layers, one output each: every Caffe layer becomes a SINGA layer of its name whose sources
are the layers that last wrote its bottoms, so Caffe's blob `conv1` after the in-place relu1
is SINGA's layer `relu1`. Each phase (TRAIN, TEST) is translated on its own, as Caffe filters
the net per phase, and the two are merged: a layer the same in both has no `include`, others
have `include: kTrain` / `include: kTest`. A phase whose net Caffe cannot build (a layer reads
a blob no earlier layer of the phase writes, e.g. the TRAIN net of a net whose only data layer
is `include { phase: TEST }`, which `caffe test` runs) is left out, and the one phase left has
no `include`.

Only exact equivalents are translated (Power only where our exporter writes it: kSTanh as
Power, TanH, Power, and kImagePreprocess's scale); a Caffe layer or setting that SINGA would
compute differently is refused (`Refused`: one line naming the file, the layer and its type),
never approximated. Params are named `<layer>_weight` and `<layer>_bias` (BatchNorm's
`_mean`, `_variance`, `_factor`; Scale's `_scale`, `_bias`).
"""
import math
from dataclasses import dataclass, field

import numpy as np

from singa.errors import ConfigError
from singa.interop.caffe.batchnorm import batch_norm, fold_values, scale_layer
from singa.interop.caffe.data import data_layer, hdf5_data, image_data, input_layer
from singa.interop.caffe.netdef import (TEST, TRAIN, Refused, copy_set, in_net_state,
                                        strip_legacy)
from singa.job import workspace
from singa.layers.neuron import STANH_A, STANH_B
from singa.naming import unrolled
from singa.proto import caffe_pb2, job_pb2

__all__ = ["Refused", "Param", "Translation", "translate"]

C = caffe_pb2


@dataclass
class Param:
    """A SINGA param: `name` (the job.conf's), its `shape`, and where its values come from:
    blob `blob` of Caffe layer `layer` (None: made here, `values` set, e.g. the zero bias of a
    layer with bias_term false, which Caffe does not learn)."""
    name: str
    shape: tuple
    layer: str
    blob: int = None
    values: np.ndarray = None
    trained: bool = False       # in Caffe's TRAIN net: it has a history in a .solverstate

    @property
    def stored(self):
        """Its name in a snapshot (`0#<name>`)."""
        return unrolled(self.name)


@dataclass
class Translation:
    layers: list                                 # LayerProto, in Caffe's order
    params: list                                 # Param, in the TRAIN net's learnable order
    phases: tuple = (TRAIN, TEST)                # the phases translated (Caffe's enum)
    notes: list = field(default_factory=list)    # lines for the user
    files: dict = field(default_factory=dict)    # path -> kvfile tuples (key, value) to write


def translate(net, net_path, weights=None, weights_path=None, data_dir=workspace.DATA,
              input_shape=None, fold_bn=False, test=True):
    """The Translation of NetParameter `net` (V2 layers, see netdef.upgrade) read from
    `net_path`; `weights` = {layer name: [Blob]} of `weights_path`; `data_dir`: where data
    files go (kvfiles the user provides, the mean file written here); `input_shape`: the
    (C, H, W) of data layers, whose records Caffe's prototxt does not describe; `fold_bn`
    (needs `weights`): BatchNorm layers of global statistics (and the Scale after one)
    folded into the Convolution before them, W' = W·k, b' = (b − μ)·k + β with
    k = γ/√(σ² + ε), μ and σ² Caffe's sums over its factor; `test` False: the TRAIN net
    only, as Caffe's solver builds for a solver without test_iter."""
    if fold_bn and weights is None:
        raise ConfigError(f"{net_path}: -fold-bn needs the weights (WEIGHTS.caffemodel)")
    t = _Translator(net, net_path, weights, weights_path, data_dir, input_shape, fold_bn)
    return t.run((TRAIN, TEST) if test else (TRAIN,))




class _Translator:
    def __init__(self, net, path, weights, weights_path, data_dir, input_shape, fold_bn):
        self.net, self.path, self.weights = net, path, weights
        self.weights_path = weights_path
        self.data_dir, self.input_shape = data_dir, input_shape
        self.params = {}        # singa name -> Param
        self.order = []         # TRAIN's learnable order
        self.notes, self.files = [], {}
        self.fold_bn = fold_bn
        self.folds = {}         # folded BatchNorm -> (its Convolution, its Scale or None, ε)
        self.has_loss = any(l.type.endswith("Loss") or l.loss_weight for l in net.layer)

    def run(self, phases):
        layers = self.net.layer
        if not layers:
            raise Refused(f"{self.path}: the net has no layers")
        gaps = {phase: self._gap(phase) for phase in phases}
        if all(gaps.values()):
            layer, blob = gaps[phases[0]]
            same = len(phases) > 1 and all(g[0] is layer and g[1] == blob for g in gaps.values())
            anywhere = " in any phase" if same else ""
            self.refuse(layer, f"reads blob '{blob}', which no earlier layer writes{anywhere}")
        for phase, gap in gaps.items():
            if gap is not None:
                name = C.Phase.Name(phase)
                self.notes.append(f"{self.path}: no {name} net (layer '{gap[0].name}' reads blob "
                                  f"'{gap[1]}', which no earlier {name} layer writes): the job "
                                  f"is the {C.Phase.Name(TEST + TRAIN - phase)} net alone")
        phases = tuple(phase for phase in phases if gaps[phase] is None)
        per_phase = {}
        for phase in phases:
            self.phase = phase
            self.tops = {}          # blob -> SINGA layer writing it last
            self.flat = set()       # blobs known to be (N, D): no spatial positions
            self.labels = {}        # label blob -> SINGA input layer
            self.shapes = {}        # blob written by an input -> its records' shape
            self.stanh = {}         # index of a TanH or last Power of an STanh -> its kSTanh
            self.fold_scale = set()  # indices of Scale layers folded with their BatchNorm
            per_phase[phase] = []
            for self.at, layer in enumerate(layers):        # self.at: where readers() looks
                per_phase[phase].append(self._layer(layer) if in_net_state(layer, phase) else None)
        out = []
        first = per_phase.get(TRAIN, per_phase.get(TEST))     # one phase: compared with itself
        for train, test in zip(first, per_phase.get(TEST, first)):
            if train is not None and test is not None and \
                    [c.SerializeToString() for c in train] == [c.SerializeToString() for c in test]:
                out += train
                continue
            for confs, phase in ((train, job_pb2.kTrain), (test, job_pb2.kTest)):
                for c in confs or ():
                    c.include.append(phase)
                    out.append(c)
        self._check_unused_weights()
        if self.folds:
            fold_values(self)
        params = [self.params[n] for n in self.order] + \
            [p for n, p in self.params.items() if n not in self.order]
        return Translation(out, params, phases, self.notes, self.files)

    def _gap(self, phase):
        """(layer, blob) of the first bottom in `phase`'s net that no earlier layer of it
        writes (where Caffe's Net::Init stops: "Unknown bottom blob"), None if there is none."""
        written = set()
        for layer in self.net.layer:
            if in_net_state(layer, phase):
                missing = next((b for b in layer.bottom if b not in written), None)
                if missing is not None:
                    return layer, missing
                written.update(layer.top)
        return None

    # --- one Caffe layer ----------------------------------------------------------------------
    def _layer(self, layer):
        """The SINGA layers of `layer` in the current phase ([] for one that only renames)."""
        kind = layer.type
        handler = _HANDLERS.get(kind)
        if handler is None:
            self.refuse(layer, "has no SINGA equivalent")
        try:
            return handler(self, layer)
        except ValueError as e:     # protobuf: a Caffe uint32 past SINGA's int32 field
            if "out of range" not in str(e):
                raise
            self.refuse(layer, f"holds a value SINGA's conf cannot: {e}")

    def refuse(self, layer, why):
        raise Refused(f"{self.path}: layer '{layer.name}' of type {layer.type or '(none)'} {why}")

    def src(self, layer, n=None):
        """The SINGA layers writing `layer`'s bottoms (n of them, checked)."""
        if n is not None and len(layer.bottom) != n:
            self.refuse(layer, f"has {len(layer.bottom)} bottoms, expected {n}")
        out = []
        for b in layer.bottom:
            if b not in self.tops:
                self.refuse(layer, f"reads blob '{b}', which no earlier layer writes")
            out.append(self.tops[b])
        return out

    def new(self, layer, type_, srcs, name=None):
        return job_pb2.LayerProto(name=name or layer.name, type=type_, srclayers=srcs)

    def one_top(self, layer, conf, flat=None):
        """`conf` writes `layer`'s one top, which is (N, D) if `flat` (None: if every bottom
        is)."""
        if len(layer.top) != 1:
            self.refuse(layer, f"has {len(layer.top)} tops, expected 1")
        self.tops[layer.top[0]] = conf.name
        self.shapes.pop(layer.top[0], None)
        if flat or flat is None and layer.bottom and all(b in self.flat for b in layer.bottom):
            self.flat.add(layer.top[0])
        else:
            self.flat.discard(layer.top[0])
        return [conf]

    def readers(self, blob, at):
        """Indices of the layers of this phase after layer `at` that read the `blob` it
        writes (until a layer writes that blob again)."""
        out = []
        for i in range(at + 1, len(self.net.layer)):
            later = self.net.layer[i]
            if in_net_state(later, self.phase):
                if blob in later.bottom:
                    out.append(i)
                if blob in later.top:
                    break
        return out

    def need_flat(self, layer):
        """Caffe's softmax is per spatial position over the channels, SINGA's over all of a
        sample's values: the same only for (N, D) scores."""
        if layer.bottom and layer.bottom[0] not in self.flat:
            self.refuse(layer, f"reads '{layer.bottom[0]}', which may have spatial positions "
                        f"(Caffe normalises each position over channels, SINGA a sample's "
                        f"values); flatten it with an InnerProduct first")

    # --- params ---------------------------------------------------------------------------
    def blobs(self, layer):
        """The layer's [Blob] in the weights; None without weights, or where the weights lack
        the layer (its params start from their fillers, as Caffe's CopyTrainedLayersFrom
        leaves them)."""
        if self.weights is None:
            return None
        return self.weights.get(layer.name)

    def add_params(self, layer, conf, shapes):
        """conf.param entries `<layer>_<role>` with lr/decay multipliers and init, for
        `shapes` = [(role, shape, blob index or None, filler)]. `shape` is the SINGA shape, or
        a function of the blob's shape giving it (or a text of what it must be); a blob that
        does not fit stops the import. Index None: a zero bias made here (bias_term: false),
        never learned."""
        blobs = self.blobs(layer)
        learnable = [s for s in shapes if s[2] is not None]
        if self.weights is not None and blobs is None and learnable:
            self.notes.append(f"{self.weights_path}: no weights for layer '{layer.name}': its "
                              f"params start from their fillers, as in Caffe")
        if blobs is not None and len(blobs) != len(learnable):
            raise ConfigError(f"{self.weights_path}: layer '{layer.name}' has {len(blobs)} "
                              f"blobs, its {layer.type} needs {len(learnable)}")
        for role, shape, index, filler in shapes:
            name = f"{layer.name}_{role}"
            p = conf.param.add(name=name)
            if index is None:
                p.init.type, p.init.value = job_pb2.kConstant, 0
                p.lr_scale = p.wd_scale = 0
                if name not in self.params:
                    self.params[name] = Param(name, shape, layer.name, None,
                                              np.zeros(shape, np.float32))
                continue
            if index < len(layer.param):
                spec = layer.param[index]
                if spec.name:
                    self.refuse(layer, f"shares param '{spec.name}' by name (not supported)")
                p.lr_scale, p.wd_scale = spec.lr_mult, spec.decay_mult
            _init(p.init, filler, layer, self)
            if blobs is not None:
                b = blobs[index]
                if callable(shape):
                    want = shape(b.shape)
                    ok = not isinstance(want, str)
                else:
                    want = shape
                    ok = (strip_legacy(b.shape, len(want)) if b.legacy else b.shape) == want
                if not ok:
                    raise ConfigError(
                        f"{self.weights_path}: layer '{layer.name}' blob {index} has shape "
                        f"{'x'.join(map(str, b.shape))}, the {layer.type} needs "
                        f"{want if isinstance(want, str) else 'x'.join(map(str, want))}")
                shape = tuple(want)
            if name not in self.params:
                self.params[name] = Param(name, None if callable(shape) else shape,
                                          layer.name, index, trained=self.phase == TRAIN)
                if self.phase == TRAIN:
                    self.order.append(name)

    def rename(self, layer):
        """Split, a Flatten that only softmaxes read (see _flatten) and a folded BatchNorm or
        Scale (see _fold): the top is the bottom's layer under another name (SINGA adds split
        layers itself)."""
        (src,) = self.src(layer, 1)
        for top in layer.top:
            self.tops[top] = src
            if layer.type == "Split" and layer.bottom[0] in self.shapes:
                self.shapes[top] = self.shapes[layer.bottom[0]]
            else:
                self.shapes.pop(top, None)
            if layer.type == "Flatten" or layer.bottom[0] in self.flat:
                self.flat.add(top)
            else:
                self.flat.discard(top)
        return []

    def _check_unused_weights(self):
        if self.weights is None:
            return
        used = {p.layer for p in self.params.values()} | \
            {n for bn, (_, scale, _) in self.folds.items() for n in (bn, scale)}
        for name, blobs in self.weights.items():
            if blobs and name not in used:
                self.notes.append(f"{self.weights_path}: layer '{name}' is not in the net; its "
                                  f"{len(blobs)} blobs are not imported (as Caffe ignores them)")

# --- the layer types ------------------------------------------------------------------------

def _conv(t, layer):
    """Convolution (weight (F, C/group·kh·kw), Caffe's bytes) and Deconvolution (weight
    (C, F/group, kh, kw), Caffe's blob); a missing bias is a zero one (see add_params)."""
    deconv = layer.type == "Deconvolution"
    p = layer.convolution_param
    if p.axis != 1 or p.force_nd_im2col:
        t.refuse(layer, "convolves on an axis other than 1 (not supported)")
    if any(d != 1 for d in p.dilation):
        t.refuse(layer, "is dilated (not supported)")
    kh, kw = _pair(t, layer, p.kernel_size, p, "kernel", None)
    ph, pw = _pair(t, layer, p.pad, p, "pad", 0)
    sh, sw = _pair(t, layer, p.stride, p, "stride", 1)
    conf = t.new(layer, job_pb2.kDeconvolution if deconv else job_pb2.kConvolution,
                 t.src(layer, 1))
    c = conf.convolution_conf
    c.num_filters = p.num_output
    _window(c, kh, kw, ph, pw, sh, sw)
    if p.group != 1:
        c.group = p.group
    f, g = p.num_output, p.group

    def weight(shape):
        if len(shape) != 4 or tuple(shape[2:]) != (kh, kw) or \
                (shape[1] * g != f if deconv else shape[0] != f):
            return f"Cx{f // g}x{kh}x{kw}" if deconv else f"{f}x(C/{g})x{kh}x{kw}"
        return tuple(shape) if deconv else (f, math.prod(shape[1:]))
    shapes = [("weight", weight, 0, p.weight_filler)]
    shapes.append(("bias", (f,), 1, p.bias_filler) if p.bias_term else ("bias", (f,), None, None))
    t.add_params(layer, conf, shapes)
    return t.one_top(layer, conf)


def _inner_product(t, layer):
    p = layer.inner_product_param
    if p.axis != 1:
        t.refuse(layer, f"flattens from axis {p.axis} (only 1 is supported)")
    conf = t.new(layer, job_pb2.kInnerProduct, t.src(layer, 1))
    conf.innerproduct_conf.num_output = p.num_output
    n = p.num_output
    if p.transpose:
        # Caffe stores K x N and computes x·W: SINGA's transpose does the same on the same bytes
        conf.innerproduct_conf.transpose = True

    def weight(shape):
        s = strip_legacy(shape, 2)
        if len(s) != 2 or s[1 if p.transpose else 0] != n:
            return f"Kx{n} (transpose)" if p.transpose else f"{n}xK"
        return tuple(s)
    shapes = [("weight", weight, 0, p.weight_filler)]
    shapes.append(("bias", (n,), 1, p.bias_filler) if p.bias_term else ("bias", (n,), None, None))
    t.add_params(layer, conf, shapes)
    return t.one_top(layer, conf, flat=True)


def _pooling(t, layer):
    p = layer.pooling_param
    if p.pool == C.PoolingParameter.STOCHASTIC:
        t.refuse(layer, "pools STOCHASTIC (not supported)")
    conf = t.new(layer, job_pb2.kPooling, t.src(layer, 1))
    c = conf.pooling_conf
    c.pool = job_pb2.PoolingProto.MAX if p.pool == C.PoolingParameter.MAX else \
        job_pb2.PoolingProto.AVG
    if p.global_pooling:        # Caffe allows no kernel, pad 0 and stride 1 only
        c.global_pooling = True
        return t.one_top(layer, conf)
    if not (p.HasField("kernel_size") or p.HasField("kernel_h")):
        t.refuse(layer, "has no kernel_size")
    kh, kw = (p.kernel_h, p.kernel_w) if p.HasField("kernel_h") else (p.kernel_size,) * 2
    ph, pw = (p.pad_h, p.pad_w) if p.HasField("pad_h") else (p.pad,) * 2
    sh, sw = (p.stride_h, p.stride_w) if p.HasField("stride_h") else (p.stride,) * 2
    _window(c, kh, kw, ph, pw, sh, sw)
    if p.round_mode == C.PoolingParameter.CEIL:
        c.ceil_mode = True
    return t.one_top(layer, conf)


def _lrn(t, layer):
    p = layer.lrn_param
    conf = t.new(layer, job_pb2.kLRN, t.src(layer, 1))
    c = conf.lrn_conf
    c.local_size, c.alpha, c.beta = p.local_size, p.alpha, p.beta
    if p.norm_region == C.LRNParameter.WITHIN_CHANNEL:
        c.norm_region = job_pb2.LRNProto.WITHIN_CHANNEL     # Caffe ignores k there: 1
    else:
        c.knorm = p.k
    return t.one_top(layer, conf)


def _relu(t, layer):
    if layer.relu_param.negative_slope != 0:
        t.refuse(layer, "has negative_slope (SINGA's ReLU ignores it)")
    return t.one_top(layer, t.new(layer, job_pb2.kReLU, t.src(layer, 1)))


def _sigmoid(t, layer):
    return t.one_top(layer, t.new(layer, job_pb2.kSigmoid, t.src(layer, 1)))


def _tanh(t, layer):
    if t.at in t.stanh:
        return []           # the middle of an STanh (see _power)
    conf = t.new(layer, job_pb2.kActivation, t.src(layer, 1))
    conf.activation_conf.type = job_pb2.TANH        # kSTanh is the scaled 1.7159·tanh(2x/3)
    return t.one_top(layer, conf)


def _power(t, layer):
    """Caffe's y = (shift + scale·x)^power where SINGA computes the same float32 steps, which
    covers all our exporter writes:
    - Power (scale B) → TanH → Power (scale A), power 1, shift 0, B and A kSTanh's constants
      (2/3 and 1.7159 as float32), whose middle blobs nothing else reads: one kSTanh named
      after the last Power;
    - x·scale (power 1, shift 0, scale ≠ 0) of an input's (C, S, S) images: kImagePreprocess
      with that scale and no crop, the same in every phase.
    Any other Power is refused."""
    p = layer.power_param
    if t.at in t.stanh:                 # the last Power of an STanh
        src, flat = t.stanh[t.at]
        return t.one_top(layer, t.new(layer, job_pb2.kSTanh, [src]), flat=flat)
    (src,) = t.src(layer, 1)
    linear = len(layer.top) == 1 and p.power == 1 and p.shift == 0
    if linear and np.float32(p.scale) == STANH_B:
        chain = _stanh_chain(t, layer)
        if chain is not None:
            tanh, last = chain
            t.stanh[tanh] = None
            t.stanh[last] = (src, layer.bottom[0] in t.flat)
            return []
    shape = t.shapes.get(layer.bottom[0])
    if linear and p.scale != 0 and shape is not None and len(shape) == 3 and \
            shape[1] == shape[2]:
        conf = t.new(layer, job_pb2.kImagePreprocess, [src])
        conf.rgbimage_conf.scale = p.scale
        out = t.one_top(layer, conf)
        t.shapes[layer.top[0]] = shape
        return out
    t.refuse(layer, f"(power {p.power:g}, scale {p.scale:g}, shift {p.shift:g}) has no SINGA "
             f"equivalent: SINGA has x·scale only on an input's (N, C, S, S) images "
             f"(kImagePreprocess) and 1.7159·tanh(2/3·x) as Power, TanH, Power (kSTanh)")


def _stanh_chain(t, layer):
    """(index of the TanH, index of the last Power) when Power `layer` (scale B) is read by
    a TanH read by a Power (scale A, power 1, shift 0); None when it is not; refused when it
    is but another layer reads a middle blob (kSTanh has no middle output)."""
    first = t.readers(layer.top[0], t.at)
    tanh = next((i for i in first if t.net.layer[i].type == "TanH"), None)
    if tanh is None or len(t.net.layer[tanh].bottom) != 1 or len(t.net.layer[tanh].top) != 1:
        return None
    second = t.readers(t.net.layer[tanh].top[0], tanh)
    last = next((i for i in second if _is_power(t.net.layer[i], STANH_A)), None)
    if last is None:
        return None
    for i, readers, blob in ((tanh, first, layer.top[0]),
                             (last, second, t.net.layer[tanh].top[0])):
        other = next((j for j in readers if j != i), None)
        if other is not None:
            t.refuse(layer, f"starts an STanh (Power, TanH, Power), but layer "
                     f"'{t.net.layer[other].name}' also reads its blob '{blob}' (SINGA's "
                     f"kSTanh has no such output)")
    return tanh, last


def _is_power(layer, scale):
    p = layer.power_param
    return layer.type == "Power" and len(layer.bottom) == 1 and len(layer.top) == 1 and \
        p.power == 1 and p.shift == 0 and np.float32(p.scale) == scale


def _dropout(t, layer):
    conf = t.new(layer, job_pb2.kDropout, t.src(layer, 1))
    conf.dropout_conf.dropout_ratio = layer.dropout_param.dropout_ratio
    return t.one_top(layer, conf)


def _softmax(t, layer):
    """SINGA's softmax (over a sample's values) on (N, D) scores; otherwise Caffe's over
    `axis` at each position of the others (softmax_conf.axis, ours)."""
    conf = t.new(layer, job_pb2.kSoftmax, t.src(layer, 1))
    axis = layer.softmax_param.axis
    if layer.bottom[0] not in t.flat or axis not in (1, -1):
        conf.softmax_conf.axis = axis
    return t.one_top(layer, conf)


def _softmax_loss(t, layer):
    scores, labels = _scores_and_labels(t, layer)
    lp = layer.loss_param
    if lp.HasField("ignore_label"):
        t.refuse(layer, "has ignore_label (not supported)")
    if lp.HasField("normalization") and lp.normalization == C.LossParameter.NONE or \
            lp.HasField("normalize") and not lp.normalize:
        t.refuse(layer, "does not normalise by the batch (SINGA's loss is the batch mean)")
    if any(w != 1 for w in layer.loss_weight):
        t.refuse(layer, "has a loss_weight other than 1")
    if layer.softmax_param.axis != 1:
        t.refuse(layer, f"normalises over axis {layer.softmax_param.axis} (only 1)")
    t.need_flat(layer)
    conf = t.new(layer, job_pb2.kSoftmaxLoss, [scores, labels])
    if len(layer.top) > 1:
        t.refuse(layer, "has several tops")
    if layer.top:
        t.tops[layer.top[0]] = conf.name
    return [conf]


def _accuracy(t, layer):
    scores, labels = _scores_and_labels(t, layer)
    p = layer.accuracy_param
    if p.HasField("ignore_label") or p.axis != 1:
        t.refuse(layer, "has ignore_label or an axis other than 1 (not supported)")
    loss = next((l for l in t.net.layer if l.type == "SoftmaxWithLoss" and
                 list(l.bottom) == list(layer.bottom) and in_net_state(l, t.phase)), None)
    if loss is not None:
        # SINGA's softmax loss reports the accuracy of its scores itself
        if p.top_k != 1:
            t.refuse(layer, f"counts the top {p.top_k} beside a SoftmaxWithLoss "
                     f"(SINGA's loss reports top-1 accuracy; drop one of the two)")
        note = (f"layer '{layer.name}' (Accuracy): the accuracy is reported by SINGA's softmax "
                f"loss '{loss.name}'")
        if note not in t.notes:
            t.notes.append(note)
        return []
    t.need_flat(layer)
    conf = t.new(layer, job_pb2.kAccuracy, [scores, labels])
    conf.argsort_conf.topk = p.top_k
    return [conf]


def _scores_and_labels(t, layer):
    if len(layer.bottom) != 2:
        t.refuse(layer, f"has {len(layer.bottom)} bottoms, expected scores and labels")
    scores, labels = t.src(layer, 2)
    if layer.bottom[1] not in t.labels:
        t.refuse(layer, f"reads labels '{layer.bottom[1]}' that no data layer writes")
    return scores, labels


def _concat(t, layer):
    p = layer.concat_param
    axis = p.concat_dim if p.HasField("concat_dim") else p.axis
    if axis < 0:
        t.refuse(layer, f"concatenates on axis {axis} (give it from the front)")
    conf = t.new(layer, job_pb2.kConcate, t.src(layer))
    conf.concate_conf.concate_dim = axis
    conf.concate_conf.num_concates = len(layer.bottom)
    return t.one_top(layer, conf)


#: Caffe layers that SINGA computes over each sample's values (flattened) when they read
#: (N, D) scores
_READS_FLAT = ("Softmax", "SoftmaxWithLoss", "Accuracy")


def _flatten(t, layer):
    """kFlatten (axis, end_axis); axes 1 to the end read only by softmaxes, which SINGA
    computes over a sample's values anyway (our export of a softmax of a 4-D blob is
    Flatten, Softmax), are the bottom's layer renamed."""
    fp = layer.flatten_param
    whole = fp.axis == 1 and fp.end_axis == -1
    readers = t.readers(layer.top[0], t.at) if len(layer.top) == 1 else []
    if whole and readers and all(t.net.layer[i].type in _READS_FLAT for i in readers):
        return t.rename(layer)
    conf = t.new(layer, job_pb2.kFlatten, t.src(layer, 1))
    copy_set(fp, conf.flatten_conf, ("axis", "end_axis"))
    return t.one_top(layer, conf, flat=whole or None)


def _eltwise(t, layer):
    p = layer.eltwise_param
    if len(layer.bottom) < 2:
        t.refuse(layer, f"has {len(layer.bottom)} bottoms, expected 2 or more")
    if p.operation == C.EltwiseParameter.PROD and not p.stable_prod_grad:
        t.refuse(layer, "has stable_prod_grad false (SINGA's PROD gradient is the stable one)")
    conf = t.new(layer, job_pb2.kEltwise, t.src(layer))
    copy_set(p, conf.eltwise_conf, ("operation",))  # PROD, SUM, MAX: the same numbers
    conf.eltwise_conf.coeff.extend(p.coeff)
    return t.one_top(layer, conf)


def _crop(t, layer):
    p = layer.crop_param
    conf = t.new(layer, job_pb2.kCrop, t.src(layer, 2))
    copy_set(p, conf.crop_conf, ("axis",))
    conf.crop_conf.offset.extend(p.offset)
    return t.one_top(layer, conf, flat=False)


def _silence(t, layer):
    t.src(layer)
    return []


_HANDLERS = {
    "Input": input_layer, "Data": data_layer, "ImageData": image_data, "HDF5Data": hdf5_data,
    "Convolution": _conv,
    "InnerProduct": _inner_product, "Pooling": _pooling, "LRN": _lrn, "ReLU": _relu,
    "Sigmoid": _sigmoid, "TanH": _tanh, "Dropout": _dropout, "Softmax": _softmax,
    "SoftmaxWithLoss": _softmax_loss, "Accuracy": _accuracy, "Concat": _concat,
    "Flatten": _flatten, "Split": _Translator.rename, "Silence": _silence, "Power": _power,
    "BatchNorm": batch_norm, "Scale": scale_layer, "Eltwise": _eltwise,
    "Deconvolution": _conv, "Crop": _crop,
}


# --- helpers ------------------------------------------------------------------------------------

def _pair(t, layer, values, p, what, default):
    """(h, w) of a ConvolutionParameter's repeated `what` or its what_h/what_w."""
    if p.HasField(f"{what}_h") or p.HasField(f"{what}_w"):
        return getattr(p, f"{what}_h"), getattr(p, f"{what}_w")
    values = list(values)
    if len(values) == 0 and default is not None:
        return default, default
    if len(values) == 1:
        return values[0], values[0]
    if len(values) == 2:
        return values[0], values[1]
    t.refuse(layer, f"has {len(values)} {what} values (2-D convolution only)")


def _window(c, kh, kw, ph, pw, sh, sw):
    """SINGA's kernel/pad/stride fields: one value when square, else the _y/_x pair."""
    for name, (y, x) in (("kernel", (kh, kw)), ("pad", (ph, pw)), ("stride", (sh, sw))):
        if y == x:
            setattr(c, name, y)
        else:
            setattr(c, f"{name}_y", y)
            setattr(c, f"{name}_x", x)


def _init(gen, filler, layer, t):
    """SINGA's ParamGenProto for a Caffe filler (fresh values only: imported ones win)."""
    kind = filler.type      # Caffe's default filler: constant 0
    if kind == "constant":
        gen.type, gen.value = job_pb2.kConstant, filler.value
    elif kind == "gaussian":
        gen.type, gen.mean, gen.std = job_pb2.kGaussian, filler.mean, filler.std
    elif kind == "uniform":
        gen.type, gen.low, gen.high = job_pb2.kUniform, filler.min, filler.max
    elif kind in ("xavier", "msra") and filler.variance_norm == C.FillerParameter.FAN_IN:
        # SINGA's *SqrtFanIn divide by sqrt(shape[1]): Caffe's fan-in for a conv or an
        # untransposed InnerProduct weight
        if kind == "xavier":
            gen.type, gen.low, gen.high = job_pb2.kUniformSqrtFanIn, -1, 1
        else:
            gen.type, gen.mean, gen.std = job_pb2.kGaussianSqrtFanIn, 0, math.sqrt(2)
        if layer.type == "InnerProduct" and layer.inner_product_param.transpose:
            t.notes.append(f"layer '{layer.name}': fresh values of its transposed weight "
                           f"scale by the fan-out, not Caffe's fan-in ({kind} filler)")
    else:
        gen.type, gen.mean, gen.std = job_pb2.kGaussian, 0, 0.01
        t.notes.append(f"layer '{layer.name}': filler '{kind}' has no SINGA init; fresh values "
                       f"would be gaussian std 0.01 (imported values are unaffected)")
