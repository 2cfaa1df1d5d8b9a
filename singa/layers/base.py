"""Layer: the unit of a NeuralNet (SINGA's Layer), the registry keyed by LayerType/user_type, and make_params.

Contract (mirrors SINGA 0.3's include/singa/neuralnet/layer.h):
  * `setup(srclayers)` allocates `data` (float32, shape (N, ...)), `grad` (same shape, or None
    for layers that take no gradient) and creates `params` (list of `singa.layers.param.Param`,
    in the order of the conf's `param` entries). Blobs that only the backward pass touches
    are made by `xp.zeros` (the OS's zero pages, not written: `zeros_like` writes them) or at
    the first backward pass, so that a net that only runs forward keeps none of them.
  * `compute_feature(flag, srclayers)` fills `data` (and `aux_data` for input layers, and
    `targets`, (N, k) float32 regression targets, for those whose store_conf has target_dim).
  * `compute_gradient(flag, srclayers)` reads `grad` (dL/d data, written by the
    destinations), fills each param's `grad`, and writes dL/d src into `src.grad_for(self)`
    (skipped when that is None). Gradients are written, not accumulated, unless `flag`
    has kAggGrad.
  * `data_for(dst)` / `grad_for(dst)`: what a destination reads / where it writes its gradient
    (connection layers give each destination its own blob).
  * `metrics(flag)`: {name: value} of the metrics since the last call (`{"Loss": 2.1,
    "accuracy": 0.3}`), then reset; {} for layers without. Layers add per-batch values with
    `add_metrics`; only logging formats them (`singa.log.format_metrics`). A class declares
    the names it adds in `METRICS` (lower-case); the conf check of checkpoint_keep_best reads
    it (a user layer that declares none produces what nobody can know beforehand, so the worker
    checks the monitored metric at the phase's first test instead).
`flag` is an OR of `job_pb2.Phase` bits (kTrain|kForward, kTest, ...).
`rng` is the net's numpy Generator, set before `setup`; layers draw all randomness from it.
`device` (`singa.device.Device`, set before `setup`) is where the layer computes: it allocates
its blobs with `self.xp` (numpy or cupy) and draws random numbers on the host. Input and
parser layers (`one_to_many`, but for `computes_on_gpu` ones) compute on the host; on a GPU
net they keep a copy of `data` (and of the labels `aux_data`) on the GPU (`mirror`,
`aux_mirror`, refreshed by `publish()` at the end of their compute_feature), which is what
`data_for` (`labels_for`) gives the other layers. No step waits for the GPU: these copies
and the random draws go through `uploads` (pinned buffers), and metrics stay device scalars
until they are read.
"""
import functools

import numpy as np

from singa.device import CPU, Uploader, host, is_host
from singa.errors import ConfigError
from singa.layers.param import Param
from singa.proto import job_pb2

_REGISTRY = {}


def register(*keys):
    """Class decorator: register a Layer class under LayerType values or user_type strings."""
    def deco(cls):
        for k in keys:
            _REGISTRY[k] = cls
        return cls
    return deco


#: SINGA layer types refused on purpose, with the reason given to the user
REFUSED = {}


def create_layer(conf):
    """Instantiate the layer class for `conf` (user_type wins over type, as in SINGA)."""
    reason = unavailable(conf)
    if reason:
        raise ConfigError(f"layer '{conf.name}': {reason}")
    return _REGISTRY[_key(conf)](conf)


def unavailable(conf):
    """Why no layer can be made for `conf` (unknown or refused type), or None if one can."""
    key = _key(conf)
    if key in _REGISTRY:
        return None
    if key in REFUSED:
        return REFUSED[key]
    name = key if isinstance(key, str) else job_pb2.LayerType.Name(key)
    return f"layer type {name} is not implemented"


def layer_class(conf):
    """The registered class for `conf`, or None."""
    return _REGISTRY.get(_key(conf))


def make_params(layer, shapes):
    """Params from the conf's `param` entries in order, one per {role: shape} of `shapes`."""
    names = ", ".join(shapes)
    confs = layer.conf.param
    if len(confs) < len(shapes):
        raise ConfigError(f"layer '{layer.name}' needs {len(shapes)} param entries ({names}), "
                          f"got {len(confs)}")
    params = []
    for conf, shape in zip(confs, shapes.values()):
        p = Param(conf)
        p.setup(shape, layer.xp)
        params.append(p)
    return params


def set_up(layer, srclayers):
    """`layer.setup(srclayers)`, after a ConfigError if their number is not the layer's
    `sources`; a ConfigError if the conf lists more params than the layer made (none unused)."""
    least, most = layer.sources
    n, conf = len(srclayers), layer.conf
    kind = type_name(conf)
    if n < least or (most is not None and n > most):
        want = (f"{least}" if most == least else f"{least} or more" if most is None
                else f"{least} to {most}")
        hint = ("; a layer of yours that reads none declares sources = (0, 0)"
                if n == 0 and conf.HasField("user_type") else "")
        raise ConfigError(f"layer '{layer.name}' ({kind}) needs {want} "
                          f"srclayer{'' if want == '1' else 's'}, got {n}{hint}")
    layer.setup(srclayers)
    if len(conf.param) > len(layer.params):
        unused = ", ".join(f"'{p.name}'" for p in conf.param[len(layer.params):])
        raise ConfigError(f"layer '{layer.name}' ({kind}) has {len(layer.params) or 'no'} "
                          f"param{'' if len(layer.params) == 1 else 's'}, but its conf lists "
                          f"{len(conf.param)}: {unused} would be unused")


def _key(conf):
    return conf.user_type if conf.HasField("user_type") else conf.type


def type_name(conf):
    """The name of a LayerProto's type: its user_type, or the LayerType's (kReLU)."""
    return conf.user_type or job_pb2.LayerType.Name(conf.type)


class Layer:
    """Base layer: holds the conf, output blob, its gradient, labels and params."""

    #: True for input layers: they may feed several destinations without a Split layer.
    #: They compute on the host (`on_host`) unless they are `computes_on_gpu`.
    one_to_many = False
    #: True for a one_to_many layer whose kernels also take device arrays: on a GPU net it
    #: computes on its partition's GPU like the other layers.
    computes_on_gpu = False
    #: the metric names the layer adds (lower-case); None: not declared (a user layer's)
    METRICS = None
    #: True when every output reads every input neuron (SINGA's kOneToAll): on partition_dim 1
    #: such a layer reads the whole of its source.
    reads_all = False
    #: True when the layer can compute a part of its outputs from a part of its source's
    #: (partition_dim 1 over several workers); a layer of your own opts in by setting it.
    feature_parts = False
    #: True when the layer's passes on a GPU only queue device operations on arrays it keeps
    #: (no host value read or written, no random draw, no Python state that changes from step
    #: to step), but for what `prepare` does: a step may then replay them as a CUDA graph
    #: (`singa.device.cuda_graphs`). Read for the layer's own class only: a subclass decides for
    #: itself.
    capturable = False
    #: the sources (indices into srclayers) whose gradient the backward pass writes, whole,
    #: asking each once for it (`grad_for`); None: every source. A kBP training step shares
    #: gradient memory between blobs by when they are live (`singa.net.grad_memory`).
    backward_to = None
    #: (least, most) source layers (srclayers) the layer reads, most None for no limit; input
    #: layers read none. `set_up` holds every layer of a net to it.
    sources = (1, None)
    device = CPU
    #: True in a net whose phase trains nothing (kTest, kVal: `NeuralNet` sets it before
    #: setup): no gradient is ever computed, so a layer may choose its kernels for the forward
    #: pass alone
    forward_only = False
    #: True in a kBP train net, whose gradient blobs `grad_memory.share` gives memory once the
    #: net is set up (`NeuralNet` sets it before setup)
    grads_planned = False
    #: the GPU copies of `data` and `aux_data` of a layer computed on the host (see the module
    #: docstring)
    mirror = aux_mirror = None
    #: regression targets (N, k) float32 of an input layer (store_conf.target_dim), and their
    #: GPU copy; None for a layer that gives none
    targets = targets_mirror = None

    def __init__(self, conf):
        self.conf = conf
        self.name = conf.name
        self.partition_id = conf.partition_id
        self.unroll_index = conf.unroll_index
        self.data = None
        self.grad = None
        self.aux_data = None
        self.params = []
        self.rng = None
        self.metric_sums = {}
        self.metric_count = 0
        self.metric_store = None    # the sums on a GPU (`keep_metrics_on_device`)

    def setup(self, srclayers):
        raise NotImplementedError

    def compute_feature(self, flag, srclayers):
        raise NotImplementedError

    def compute_gradient(self, flag, srclayers):
        pass

    def by_rows(self, flag, srclayers):
        """The forward pass `flag` of a layer whose samples' outputs depend on those samples
        of its one source alone, as fn(rows) computing a slice of them (once the pass's own
        work, e.g. per-channel constants, is done); None for any other layer or pass. A
        convolution on the host computes its followers' rows right after each chunk of its
        own, while the chunk is in the cache (`NeuralNet`: `ConvolutionLayer.then`)."""
        return None

    #: whether this pass's outputs were computed by its source's chunks (`by_rows`); a
    #: layer with `by_rows` then skips its compute_feature once (`computed_ahead`)
    ahead = False

    def computed_ahead(self):
        """True (once) when this forward pass was computed with the source's chunks."""
        done, self.ahead = self.ahead, False
        return done

    def new_grad(self, shape=None):
        """A zero gradient blob, float32, of `shape` (default: that of `data`) on the layer's
        device. On a GPU, where the net gives its gradients memory itself (`grads_planned`) or
        computes none (`forward_only`), a host placeholder instead, numpy's zeros whose pages
        are never written: no device memory is taken for gradients the net shares or never
        computes."""
        shape = self.data.shape if shape is None else shape
        if (self.grads_planned or self.forward_only) and self.device.gpu is not None:
            return np.zeros(shape, np.float32)
        return self.xp.zeros(shape, np.float32)

    def prepare(self, flag, srclayers):
        """The host's work of the pass `flag` names (kForward or kBackward) of a capturable
        layer, which a CUDA graph of its passes does not replay (a check of the batch): the
        pass calls it itself; a step that launches the pass as a graph calls it before."""

    @functools.cached_property
    def uploads(self):
        """The layer's host-to-device copies that do not wait (`device.Uploader`)."""
        return Uploader()

    @property
    def xp(self):
        """The array module of the layer's device: numpy or cupy."""
        return self.device.xp

    def data_for(self, dst):
        """`data` where `dst` computes (its GPU copy for a layer on the GPU); a ConfigError
        for a layer without data (a label provider)."""
        data = _where(dst, self.data, self.mirror)
        if data is None:
            raise ConfigError(f"layer '{dst.name}' reads the data of layer '{self.name}' "
                              f"({type_name(self.conf)}), which has none (it gives labels to a "
                              f"loss)")
        return data

    def labels_for(self, dst):
        """The labels `aux_data` where `dst` computes (its GPU copy for a layer on the GPU)."""
        return _where(dst, self.aux_data, self.aux_mirror)

    def targets_for(self, dst):
        """The regression `targets` where `dst` computes (its GPU copy for a layer on the GPU)."""
        return _where(dst, self.targets, self.targets_mirror)

    def draw(self, out, method="random"):
        """Fill `out` with float32 draws of `rng` (`random`: U[0, 1); `standard_normal`), made
        on the host in the same order on either device, so a GPU run draws a CPU run's numbers."""
        if is_host(out):
            getattr(self.rng, method)(dtype=np.float32, out=out)
            return
        values = np.empty(out.shape, np.float32)
        getattr(self.rng, method)(dtype=np.float32, out=values)
        self.uploads(out, values)

    def close(self):
        """Release what the layer holds open (a store, a reading thread): its net is done."""

    def make_mirror(self, device, host_read):
        """Give this host layer's `data`, `aux_data` (and `targets`) GPU copies on `device`,
        `mirror`, `aux_mirror` (and `targets_mirror`), for the layers there that read it;
        `host_read`: host layers read it too."""
        self.mirror = device.xp.zeros(self.data.shape, self.data.dtype)
        if self.aux_data is not None:
            self.aux_mirror = device.xp.zeros(self.aux_data.shape, self.aux_data.dtype)
        if self.targets is not None:
            self.targets_mirror = device.xp.zeros(self.targets.shape, self.targets.dtype)

    def publish(self):
        """Copy `data`, `aux_data` and `targets` to their GPU mirrors (if any): the end of a
        host layer's compute_feature."""
        if self.mirror is not None:
            self.uploads(self.mirror, self.data)
        if self.aux_mirror is not None:
            self.uploads(self.aux_mirror, self.aux_data)
        if self.targets_mirror is not None:
            self.uploads(self.targets_mirror, self.targets)

    def grad_for(self, dst):
        return self.grad

    def add_metrics(self, values, count=1):
        """Add {name: value}, the sums over `count` more batches, to what `metrics` averages;
        a value may be a device scalar (a 0-d array), summed on its device until it is read."""
        if self.metric_store is not None:
            for i, name in enumerate(self.metric_sums):
                if name in values:
                    view = self.metric_store[i, ...]
                    view += values[name]
            view = self.metric_store[-1, ...]
            view += count
            return
        for name, value in values.items():
            self.metric_sums[name] = self.metric_sums.get(name, 0.0) + value
        self.metric_count += count

    def keep_metrics_on_device(self, names):
        """Sum metrics `names` in place on the layer's GPU: `metric_store` holds their sums and
        their count (float64), which `add_metrics` (or a kernel of the layer's) adds to and
        `metrics` reads in one wait; `metric_sums` are 0-d views of it. A step's metrics are
        then device work alone, which a CUDA graph replays (`capturable`)."""
        self.metric_store = self.xp.zeros(len(names) + 1, np.float64)
        self.metric_sums = {name: self.metric_store[i, ...] for i, name in enumerate(names)}

    def metrics(self, flag):
        """{name: sum / count} of what was added since the last call, then reset; {} if nothing."""
        if self.metric_store is not None:
            *sums, count = map(float, host(self.metric_store))
            self.metric_store.fill(0)
            return dict(zip(self.metric_sums, (v / count for v in sums))) if count else {}
        if not self.metric_count:
            return {}
        means = {name: float(value) / self.metric_count
                 for name, value in self.metric_sums.items()}
        self.metric_sums, self.metric_count = {}, 0
        return means

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r})"


def on_host(layer):
    """Whether `layer` computes on the host on a GPU net: an input or parser layer
    (`one_to_many`) that is not `computes_on_gpu`."""
    return getattr(layer, "one_to_many", False) and not getattr(layer, "computes_on_gpu", False)


def _where(dst, blob, mirror):
    """A host layer's `blob`, or its GPU `mirror` (if any) for a `dst` that is no host layer."""
    return blob if mirror is None or on_host(dst) else mirror
