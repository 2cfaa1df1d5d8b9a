"""A job's test net read for export: its layers as a sequence of ops over named tensors, with
the values of a snapshot; what ONNX and Caffe writers translate (SINGA's deploy view: the
inputs' data in, the softmax of the loss layer out).

`read(conf_path, snapshot)` builds the job's kTest net with each input layer (kRecordInput,
kCSVInput) replaced by a kDummy input of its shape, so no data store is opened, loads every
param from the snapshot and walks the layers in order: Split layers are aliases, a loss layer
becomes the Softmax of its scores (kSoftmaxLoss) or outputs its prediction (kEuclideanLoss),
output layers (kAccuracy, kArgSort, kCSVOutput, kRecordOutput) are left out, and so are
inputs that only feed labels.
"""
import dataclasses
import os
import re

import numpy as np

from singa.checkpoint.format import CheckpointReader, parse_step_worker
from singa.checkpoint.format import folder as checkpoint_folder
from singa.checkpoint.load import load_params
from singa.checkpoint.snapshots import latest_snapshot, snapshot_at
from singa.errors import CheckpointError, ConfigError
from singa.job import config
from singa.layers.base import type_name
from singa.naming import plain
from singa.net.neuralnet import NeuralNet
from singa.net.phase import in_phase
from singa.proto import job_pb2

__all__ = ["Op", "Model", "read", "snapshot_readers", "deploy_net"]

INPUTS = (job_pb2.kRecordInput, job_pb2.kCSVInput)
OUTPUT_LAYERS = (job_pb2.kAccuracy, job_pb2.kArgSort, job_pb2.kCSVOutput, job_pb2.kRecordOutput)
#: layer type -> op type; the others have no export (refused by name)
OP_TYPES = {
    job_pb2.kConvolution: "Convolution", job_pb2.kCConvolution: "Convolution",
    job_pb2.kCudnnConv: "Convolution",
    job_pb2.kPooling: "Pooling", job_pb2.kCPooling: "Pooling", job_pb2.kCudnnPool: "Pooling",
    job_pb2.kInnerProduct: "InnerProduct",
    job_pb2.kReLU: "ReLU", job_pb2.kSigmoid: "Sigmoid", job_pb2.kSTanh: "STanh",
    job_pb2.kDropout: "Dropout", job_pb2.kLRN: "LRN", job_pb2.kCudnnLRN: "LRN",
    job_pb2.kSoftmax: "Softmax", job_pb2.kCudnnSoftmax: "Softmax",
    job_pb2.kSoftmaxLoss: "Softmax", job_pb2.kCudnnSoftmaxLoss: "Softmax",
    job_pb2.kConcate: "Concat", job_pb2.kImagePreprocess: "Preprocess",
    job_pb2.kCaffeBatchNorm: "BatchNorm", job_pb2.kScale: "Scale", job_pb2.kEltwise: "Eltwise",
    job_pb2.kFlatten: "Flatten", job_pb2.kDeconvolution: "Deconvolution", job_pb2.kCrop: "Crop",
}
ACTIVATIONS = {job_pb2.RELU: "ReLU", job_pb2.SIGMOID: "Sigmoid", job_pb2.TANH: "Tanh",
               job_pb2.STANH: "STanh"}


@dataclasses.dataclass
class Op:
    """One layer as an op: `type` (Input, Convolution, Pooling, InnerProduct, ReLU, Sigmoid,
    Tanh, STanh, Dropout, LRN, Softmax, Concat, Preprocess, and Caffe's BatchNorm, Scale,
    Eltwise, Flatten, Deconvolution, Crop), the op names it reads, its output
    shape (batch first; the layer's source shape in `in_shapes`), and its params as float32
    arrays in the conf's order with their names (`w1`, without SINGA's `0#`)."""
    name: str
    type: str
    inputs: list
    conf: job_pb2.LayerProto
    shape: tuple
    in_shapes: list
    params: list = dataclasses.field(default_factory=list)
    param_names: list = dataclasses.field(default_factory=list)
    layer: object = dataclasses.field(default=None, repr=False)     # our Layer


@dataclasses.dataclass
class Model:
    """The ops in order; `inputs` (Input ops) and `outputs` (names of the ops nothing reads);
    `step` of the snapshot; `net` our kTest net holding the same values (`forward`)."""
    name: str
    ops: list
    inputs: list
    outputs: list
    step: int
    conf_path: str
    net: NeuralNet

    def forward(self, feeds):
        """{op name: our layer's output} for {input name: batch} (the net's batch size)."""
        for op in self.inputs:
            op.layer.feed(feeds[op.name])
        n = len(self.inputs[0].layer.data) if self.inputs else 0
        for layer in self.net.layers:       # label providers of loss layers
            if layer.conf.type in (job_pb2.kDummy, job_pb2.kSplit):
                layer.aux_data = np.zeros(n, np.int32)
        self.net.forward(job_pb2.kTest)
        return {op.name: op.layer.data.copy() for op in self.ops}


def read(conf_path, snapshot, target="ONNX"):
    """The Model of job conf `conf_path` with the values of `snapshot` (see
    `snapshot_readers`); an unsupported layer (named for `target`) or a conf/snapshot
    mismatch is a one-line SingaError."""
    job = config.load_job(os.path.abspath(conf_path), check_paths=False)
    _check_types(job.neuralnet, conf_path, target)
    try:
        net = NeuralNet(deploy_net(job.neuralnet, conf_path), job_pb2.kTest,
                        np.random.default_rng(0))
    except ConfigError as e:        # a layer's own check: name the conf too
        raise ConfigError(f"{conf_path}: {e}") from None
    ops, alias = [], {}
    for layer in net.layers:
        op = _op(net, layer, alias, conf_path, target)
        if op is not None:
            ops.append(op)
    readers = snapshot_readers(snapshot, job.cluster.nworkers_per_group)
    owners = {p.name: p for p in net.owner_params}
    loaded = load_params(readers, owners)
    missing = [n for n in owners if n not in loaded]
    if missing:
        where = ", ".join(r.path for r in readers)
        raise CheckpointError(f"{where}: no param '{_short(missing[0])}' for {conf_path}"
                              + (f" ({len(missing) - 1} more missing)" if len(missing) > 1
                                 else ""))
    for op in ops:
        op.params = [np.asarray(p.data, np.float32) for p in op.layer.params]   # no copy
    read_by = {i for op in ops for i in op.inputs}
    ops = [op for op in ops if op.type != "Input" or op.name in read_by]
    outputs = [op.name for op in ops if op.name not in read_by and op.type != "Input"]
    step = next((r.step for r in readers if r.step is not None), 0)
    return Model(job.name, ops, [op for op in ops if op.type == "Input"], outputs, step,
                 conf_path, net)


def snapshot_readers(path, nworkers=None):
    """CheckpointReaders of SNAPSHOT `path`: a snapshot file (with the other worker files of
    its step when it is one of several), a checkpoint folder or a workspace (its newest
    complete snapshot, as -resume picks it), or `<folder>/step<N>` (that step's snapshot)."""
    if os.path.isfile(path):
        sw = parse_step_worker(os.path.basename(path))
        folder = os.path.dirname(os.path.abspath(path))
        if sw is not None and any(parse_step_worker(f) not in (None, sw) and
                                  parse_step_worker(f)[0] == sw[0] for f in os.listdir(folder)):
            return snapshot_at(folder, sw[0]).parsed()
        return [CheckpointReader(path)]
    if os.path.isdir(path):
        folder = checkpoint_folder(path) if os.path.isdir(checkpoint_folder(path)) else path
        snap = latest_snapshot(folder, nworkers)
        if snap is None:
            raise CheckpointError(f"{folder}: no complete snapshot")
        return snap.parsed()
    m = re.fullmatch(r"step(\d+)", os.path.basename(path))
    if m and os.path.isdir(os.path.dirname(path) or "."):
        return snapshot_at(os.path.dirname(path) or ".", int(m.group(1))).parsed()
    raise CheckpointError(f"{path}: no such snapshot file or checkpoint folder")


def deploy_net(net_conf, conf_path):
    """A copy of `net_conf` whose input layers are kDummy inputs of shape (batch, *shape)."""
    out = job_pb2.NetProto()
    out.CopyFrom(net_conf)
    for layer in out.layer:
        if layer.type not in INPUTS or layer.HasField("user_type"):
            continue
        sc = layer.store_conf
        if not sc.batchsize or not sc.shape:
            raise ConfigError(f"{conf_path}: layer '{layer.name}' ({type_name(layer)}) needs "
                              f"store_conf.batchsize and store_conf.shape to be exported")
        shape = [sc.batchsize[0]] + list(sc.shape)
        layer.ClearField("store_conf")
        layer.type = job_pb2.kDummy
        layer.dummy_conf.input = True
        layer.dummy_conf.shape.extend(shape)
    return out


def _check_types(net_conf, conf_path, target):
    """Refuse a test-net layer of a type without export before the net is built (building
    one may read files, e.g. kCharRNN's vocabulary)."""
    known = set(OP_TYPES) | set(INPUTS) | set(OUTPUT_LAYERS) | {
        job_pb2.kDummy, job_pb2.kSplit, job_pb2.kEuclideanLoss, job_pb2.kActivation,
        job_pb2.kCudnnActivation}
    for conf in net_conf.layer:
        if in_phase(conf, job_pb2.kTest) and (conf.HasField("user_type") or conf.type not in known):
            raise _no_equivalent(conf_path, conf, target)


def _no_equivalent(conf_path, conf, target):
    return ConfigError(f"{conf_path}: layer '{_short(conf.name)}' ({type_name(conf)}) has no "
                       f"{target} equivalent")


def _short(name):
    return plain(name)


def _op(net, layer, alias, conf_path, target):
    """The Op of `layer` (None for a layer left out); Split layers go into `alias`."""
    conf, name = layer.conf, _short(layer.name)
    srcs = [alias.get(_short(s.name), _short(s.name)) for s in net.srclayers[layer.name]]
    in_shapes = [s.data_for(layer).shape for s in net.srclayers[layer.name]]
    if conf.HasField("user_type"):
        kind = None
    elif conf.type == job_pb2.kDummy:
        kind = "Input" if conf.dummy_conf.input else None
    elif conf.type == job_pb2.kSplit:
        alias[name] = srcs[0]
        return None
    elif conf.type in OUTPUT_LAYERS:
        return None
    elif conf.type == job_pb2.kEuclideanLoss:
        return None                         # its prediction (first source) stays an output
    elif conf.type in (job_pb2.kActivation, job_pb2.kCudnnActivation):
        kind = ACTIVATIONS.get(conf.activation_conf.type)
    else:
        kind = OP_TYPES.get(conf.type)
    if kind is None:
        raise _no_equivalent(conf_path, conf, target)
    if kind == "Softmax" and conf.type in (job_pb2.kSoftmaxLoss, job_pb2.kCudnnSoftmaxLoss):
        srcs, in_shapes = srcs[:1], in_shapes[:1]       # the second source gives labels
    return Op(name, kind, srcs, conf, tuple(layer.data.shape), in_shapes,
              param_names=[_short(p.name) for p in layer.params], layer=layer)
