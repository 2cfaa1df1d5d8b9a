"""Data feeding of the Python API: numpy samples, iterables of (x, y) batches and Data layers
given to `fit`, `evaluate` and `predict` as the model's data layers of a phase (numpy data as
memory stores, iterables written once as kvfiles in `<workspace>/data`), the conf's input
layers reading them for a model of a conf, and the checks that numpy data would not be read
wrongly without a word.

compile's 'mean_squared_error' is Keras' (kMSELoss against y) or, for a model whose data have
no y, SINGA's (kEuclideanLoss reconstructing x, as SINGA's Autoencoder scripts use it): the
first data the model has decide (`match_loss`). Numpy y are then read as the loss compares
them: regression targets (store_conf.target_dim) for a kMSELoss, integers too, as Keras'; class
labels for a softmax loss, floats only when they hold integers (others would be truncated)."""
import copy
import os
import shutil

import numpy as np

from singa.api.session import STORE_INPUTS
from singa.errors import ConfigError
from singa.io import memory
from singa.io.records import class_indices, holds_targets, write_records
from singa.io.store import count_records
from singa.job.workspace import DATA
from singa.layer import Data, setval
from singa.net.phase import in_phase
from singa.proto import job_pb2
from singa.train import evaluation

__all__ = ["LABELLED", "CONVOLUTIONS", "STREAM_RESERVE", "as_data", "check_finite",
           "check_input", "copy_data", "match_loss", "net_of", "predict_net", "put_conf_data",
           "put_data", "set_batchsize", "split", "steps_per_pass", "streams_folder",
           "whole_pass"]

#: layers whose metrics compare outputs with labels
LABELLED = (job_pb2.kSoftmaxLoss, job_pb2.kCudnnSoftmaxLoss, job_pb2.kAccuracy)
CONVOLUTIONS = (job_pb2.kConvolution, job_pb2.kCConvolution, job_pb2.kCudnnConv)
#: bytes of free disk an iterable of batches written without a bound must leave
STREAM_RESERVE = 1 << 30
_END = object()


def as_data(data, y, phase, batch_size, what, folder, steps=None, exact=False):
    """A Data layer of `phase` (and no other) from numpy samples (with labels `y`), from an
    iterable of (x, y) batches (at most, or with `exact` exactly, its first `steps` batches,
    else all, written first as a kvfile in `folder`, see `_streamed`) or from a Data layer: a copy of it, whatever phase it
    was made for (a `Data(x=...)` keeps its default phase 'train' when given as test or
    validation data), the caller's untouched. Samples that are not finite are refused."""
    if data is None:
        raise ConfigError(f"{what}: no data given")
    if isinstance(data, tuple) and len(data) == 2 and y is None:
        data, y = data
    name = job_pb2.Phase.Name(phase)[1:].lower()
    if isinstance(data, list) and y is not None:
        data = np.asarray(data)
    if isinstance(data, np.ndarray):
        check_finite(data, what)
        own = Data(x=data, y=y, phase=name, batch_size=batch_size or 64)
        own.from_numpy = True   # preprocessed as the model's data layer (_take_preprocessing)
        x, y = memory.arrays(own.layer.store_conf.path)
        own.samples = (x.shape[1:], y is not None)
        return own
    if not getattr(data, 'is_datalayer', False):
        if y is None and hasattr(data, '__iter__'):
            return _streamed(data, name, batch_size, what, folder, steps, exact)
        raise ConfigError(f"{what}: data must be numpy samples, an iterable of (x, y) "
                          f"batches or a Data layer, got {type(data).__name__}")
    own = copy_data(data)
    own.layer.ClearField('include')
    own.layer.ClearField('exclude')
    own.layer.include.append(phase)
    if batch_size is not None:
        del own.layer.store_conf.batchsize[:]
        setval(own.layer.store_conf, batchsize=batch_size)
    return own


def check_finite(x, what, first=0):
    """Refuse numpy samples `x` holding NaN or an infinity (their metrics would be nonsense:
    a NaN row scores as class 0), naming the first such sample (counted from `first`)."""
    x = np.asarray(x)
    if x.dtype.kind in 'fc' and not np.isfinite(x).all():
        bad = first + int(np.argmin(np.isfinite(x.reshape(len(x), -1)).all(axis=1)))
        raise ConfigError(f"{what}: sample {bad} of x is not finite (NaN or infinite values)")


def copy_data(data):
    """A copy of Data layer `data` with a LayerProto of its own."""
    own = copy.copy(data)
    own.layer = job_pb2.LayerProto()
    own.layer.CopyFrom(data.layer)
    return own


def split(x, y, fraction):
    """Keras' validation_split: (x, y to train, (x, y) to validate), the last `fraction` of
    the samples validating."""
    if isinstance(x, tuple) and len(x) == 2 and y is None:
        x, y = x
    if not isinstance(x, np.ndarray):
        raise ConfigError("fit: validation_split splits numpy x (and y); for a Data layer give "
                          "validation_data")
    if not (isinstance(fraction, (float, int)) and 0 < fraction < 1):
        raise ConfigError(f"fit: validation_split must be a fraction in (0, 1), got "
                          f"{fraction!r}")
    at = int(len(x) * (1 - fraction))
    if at in (0, len(x)):
        raise ConfigError(f"fit: validation_split {fraction} of {len(x)} samples leaves no "
                          f"sample to {'train' if at == 0 else 'validate'}")
    y = None if y is None else np.asarray(y)
    return x[:at], None if y is None else y[:at], (x[at:], None if y is None else y[at:])


def check_input(data, protos, what):
    """Numpy data (`data`, a Data layer from `as_data`) that a net of the LayerProtos `protos`
    would read wrongly without a word: no labels (or targets) for a layer that compares with
    them, float y that are no class labels, images channels-last for a convolution. Float y
    holding class labels are read as such."""
    if not hasattr(data, 'samples'):
        return
    shape, labelled = data.samples
    needs = [p.name for p in protos if p.type in LABELLED]
    regress = [p.name for p in protos if p.type == job_pb2.kMSELoss]
    if not labelled and (needs or regress):
        raise ConfigError(f"{what}: layer '{(needs or regress)[0]}' compares the outputs with "
                          + ("labels: give y (without it every sample would count as label 0)"
                             if needs else "targets: give y (without it every target would "
                                           "be 0)"))
    sc = data.layer.store_conf
    if needs and sc.target_dim and sc.backend == 'memory':
        y = memory.arrays(sc.path)[1]
        if not np.array_equal(y, np.round(y)):
            raise ConfigError(f"{what}: y holds floats such as {y[y != np.round(y)][0]}, but "
                              f"layer '{needs[0]}' compares the outputs with class labels: give "
                              f"class indices (ints; floats would be truncated), or compile "
                              f"with loss='mse' for regression targets")
        class_indices(y, len(y))
        sc.target_dim = 0
    if len(shape) == 3 and shape[-1] in (1, 3) and shape[0] not in (1, 3) \
            and any(p.type in CONVOLUTIONS for p in protos):
        raise ConfigError(f"{what}: images are (N, C, H, W), and samples of shape {shape} "
                          f"look channels-last (H, W, C): give x.transpose(0, 3, 1, 2)")


def put_data(layers, data, phase):
    """The layers (singa.layer objects) of a built model with `data` (a Data layer of `phase`
    only, ours to change) as its data layer of `phase`, first (as SINGA inserts it), in place
    of those it had, and named as its data layers of the other phases: a net's layers read one
    input name whatever the phase."""
    mine = [ly.layer for ly in layers if ly.is_datalayer]
    template = next((ly for ly in mine if in_phase(ly, phase)), mine[0] if mine else None)
    if getattr(data, 'from_numpy', False) and template is not None:
        _take_preprocessing(data.layer.store_conf, template.store_conf)
    layers = [ly for ly in layers if not (ly.is_datalayer and in_phase(ly.layer, phase))]
    others = [ly for ly in layers if ly.is_datalayer]
    if others:
        data.layer.name = others[0].layer.name
    elif getattr(data, 'generated_name', False):
        data.layer.name = 'data0'   # as made first, before any layer: SINGA's scripts' name
    layers = [data] + layers
    match_loss(layers)
    return layers


def match_loss(layers):
    """The loss of compile's 'mean_squared_error' among `layers` (singa.layer objects of a
    model, its data layers first), `keras_mse` until data decide it: once the model has a data
    layer, the first one's y decide, for good: with y (numpy y, or a store of targets:
    store_conf.target_dim) Keras' kMSELoss, without SINGA's reconstruction of x
    (kEuclideanLoss). Then, for a kMSELoss, numpy y of any number type are read as targets."""
    data = [ly for ly in layers if ly.is_datalayer]
    for ly in layers:
        if getattr(ly, 'keras_mse', False) and data:
            sc = data[0].layer.store_conf
            targets = sc.target_dim > 0 or (sc.backend == 'memory'
                                            and memory.arrays(sc.path)[1] is not None)
            ly.keras_mse = False
            if targets:     # named as a Loss('mseloss') of the same number
                ly.layer.type = job_pb2.kMSELoss
                ly.layer.name = ly.layer.name.replace('euclideanloss', 'mseloss', 1)
    if not any(ly.layer.type == job_pb2.kMSELoss for ly in layers):
        return
    for ly in data:
        sc = ly.layer.store_conf
        y = memory.arrays(sc.path)[1] if sc.backend == 'memory' else None
        if y is not None and not sc.target_dim:
            sc.target_dim = int(np.prod(y.shape[1:], dtype=int))


def put_conf_data(conf_net, data, phase):
    """NetProto `conf_net` (a conf's) reading `data` (a Data layer) in `phase` through its
    input layer of that phase (else of another): its name and preprocessing (shape, mean,
    std) kept, its store the data's; the conf's inputs of `phase` give way (excluded, or
    removed when they serve only `phase`)."""
    inputs = [ly for ly in conf_net.layer if ly.type in STORE_INPUTS]
    if not inputs:
        raise ConfigError("the conf's net has no input layer reading a store (kRecordInput, "
                          "kCSVInput) to read numpy data through")
    template = next((ly for ly in inputs if in_phase(ly, phase)), inputs[0])
    given = data.layer.store_conf
    own = job_pb2.LayerProto()
    own.CopyFrom(template)
    own.type = data.layer.type
    own.ClearField('include')
    own.ClearField('exclude')
    own.include.append(phase)
    sc = own.store_conf
    if int(np.prod(given.shape)) != int(np.prod(sc.shape)):
        raise ConfigError(f"data: samples of shape {tuple(given.shape)} do not fit input "
                          f"layer '{own.name}' of shape {tuple(sc.shape)}")
    sc.backend, sc.path, sc.random_skip = given.backend, given.path, given.random_skip
    del sc.batchsize[:]
    sc.batchsize.extend(given.batchsize)
    sc.ClearField('whole_pass')
    if not getattr(data, 'from_numpy', False):      # a Data layer's own preprocessing
        _take_preprocessing(sc, given, shape=False)
    layers = []
    for ly in conf_net.layer:
        if ly in inputs and in_phase(ly, phase):
            if list(ly.include) == [phase]:
                continue
            ly.exclude.append(phase)
        layers.append(ly)
    net = job_pb2.NetProto()
    net.layer.add().CopyFrom(own)
    for ly in layers:
        net.layer.add().CopyFrom(ly)
    return net


def set_batchsize(protos, phase, batch_size):
    """Set the batch size of the input layers of `phase` among the LayerProtos `protos`."""
    for ly in protos:
        if ly.type in STORE_INPUTS and in_phase(ly, phase):
            del ly.store_conf.batchsize[:]
            setval(ly.store_conf, batchsize=batch_size)


def predict_net(net):
    """The net predict runs of NetProto `net` (a model's, built): the layers of its test
    phase (else of its train phase, when no input of the test phase reads a store), every
    input layer reading the samples predict feeds (the store a conf names may be gone)."""
    data = [ly for ly in net.layer if ly.type in STORE_INPUTS]
    if not data:
        raise ConfigError("predict: the model's net has no input layer reading a store")
    tested = any(in_phase(ly, job_pb2.kTest) for ly in data)
    out = net_of(net, job_pb2.kTest if tested else job_pb2.kTrain)
    for ly in out.layer:
        if ly.type in STORE_INPUTS:
            ly.store_conf.backend, ly.store_conf.path = 'memory', 'memory://predict'
            ly.type = job_pb2.kRecordInput
    return out


def net_of(net, phase):
    """The layers of NetProto `net` in `phase`, as a net for every phase (no include/exclude):
    the net evaluate tests."""
    out = job_pb2.NetProto()
    for ly in net.layer:
        if in_phase(ly, phase):
            new = out.layer.add()
            new.CopyFrom(ly)
            new.ClearField('include')
            new.ClearField('exclude')
    return out


def steps_per_pass(protos, streams):
    """The train steps of one pass over the train data given to fit, read by one of the data
    LayerProtos `protos` (iterables: kvfiles in `streams`)."""
    data = [p for p in protos if in_phase(p, job_pb2.kTrain) and _given(p.store_conf, streams)]
    if not data:
        raise ConfigError("fit: epochs counts passes over data given to fit (numpy, or "
                          "an iterable of batches); for a store give nb_epoch (steps)")
    sc = data[0].store_conf
    return evaluation.pass_steps(count_records(sc.backend, sc.path), sc.batchsize[0])


def whole_pass(net, phase, explicit, streams):
    """Mark the inputs of `phase` alone in NetProto `net` that read data given to fit or
    evaluate (numpy: memory stores; iterables: kvfiles in `streams`) to read every sample once
    per test (store_conf.whole_pass); (the steps of that pass, its samples), or (0, 0) (none,
    or steps `explicit`ly asked for, SINGA's way)."""
    if explicit:
        return 0, 0
    steps = samples = 0
    for ly in net.layer:
        sc = ly.store_conf
        if ly.type in STORE_INPUTS and _given(sc, streams) \
                and list(ly.include) == [phase]:
            sc.whole_pass = True
            samples = count_records(sc.backend, sc.path)
            steps = max(steps, evaluation.pass_steps(samples, sc.batchsize[0]))
    return steps, samples


def streams_folder(workspace):
    """Where iterables of batches are written as kvfiles: `<workspace>/data`."""
    return os.path.join(os.path.abspath(workspace), DATA)


def _given(sc, streams):
    """Whether StoreProto `sc` reads data handed to the API (numpy, or an iterable written to
    the folder `streams`), not a store a conf or Data layer names."""
    return sc.backend == 'memory' or os.path.dirname(sc.path) == streams


def _streamed(batches, phase, batch_size, what, folder, steps=None, exact=False):
    """A Data layer of `phase` reading the (x, y) batches (or x alone, labels 0) of the
    iterable `batches`, written chunk by chunk as the kvfile `<folder>/<phase>-stream.bin`
    first: data larger than memory, read in order like any store, by every process of the
    job. Its first `steps` batches (with `exact`, an iterable that ends before them is
    refused), else every batch until it ends, while the disk keeps STREAM_RESERVE free (an endless generator
    given without steps is refused then, not drained into a full disk). A batch is
    `batch_size` samples, by default the first batch's size."""
    seen = {}

    def chunks():
        taken, pulled = 0, iter(batches)
        while steps is None or taken < steps:     # no batch pulled beyond those taken
            item = next(pulled, _END)
            if item is _END:
                break
            x, y = item if isinstance(item, tuple) and len(item) == 2 else (item, None)
            x = np.asarray(x)
            if seen.setdefault('shape', x.shape[1:]) != x.shape[1:]:
                raise ConfigError(f"{what}: a batch of samples of shape {x.shape[1:]} after "
                                  f"samples of shape {seen['shape']}")
            check_finite(x, what, seen.get('samples', 0))
            seen.setdefault('batch', len(x))
            seen['samples'] = seen.get('samples', 0) + len(x)
            seen['labelled'] = seen.get('labelled', True) and y is not None
            if y is not None and 'targets' not in seen:     # as write_records: the first y
                seen['targets'] = holds_targets(y) and int(np.prod(np.shape(y)[1:], dtype=int))
            if steps is None and shutil.disk_usage(folder).free < STREAM_RESERVE:
                raise ConfigError(
                    f"{what}: the iterable of batches has not ended after {taken} batches "
                    f"({seen['samples']} samples written to {folder}), and the disk has less "
                    f"than {STREAM_RESERVE >> 20} MiB left: an endless generator? give "
                    f"steps_per_epoch (validation_steps, steps): the batches to take")
            taken += 1
            yield x, y
        if exact and taken < steps:
            raise ConfigError(f"{what}: the iterable of batches ended after {taken} batches, "
                              f"and {steps} are asked for (steps_per_epoch x epochs, "
                              f"validation_steps or steps)")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{what}: cannot make {folder}: {e.strerror}") from None
    path = os.path.join(folder, f"{phase}-stream.bin")
    if not write_records(path, chunks()):
        raise ConfigError(f"{what}: the iterable of batches gave no samples")
    own = Data(load='recordinput', phase=phase, path=path, backend='kvfile',
               shape=list(seen['shape']), batchsize=batch_size or seen['batch'],
               **({'target_dim': seen['targets']} if seen.get('targets') else {}))
    own.from_numpy, own.streamed = True, True
    own.samples = (seen['shape'], seen['labelled'])
    return own


def _take_preprocessing(dst, src, shape=True):
    """StoreProto `dst` preprocesses as `src` does (mean, std: values or files), and takes its
    sample shape when the sizes agree."""
    for field in ('mean_value', 'std_value', 'mean_file', 'std_file'):
        dst.ClearField(field)
        if src.HasField(field):
            setattr(dst, field, getattr(src, field))
    if shape and src.shape and int(np.prod(src.shape)) == int(np.prod(dst.shape)):
        del dst.shape[:]
        dst.shape.extend(src.shape)
