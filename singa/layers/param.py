"""Param: a named, versioned float32 array with its gradient; SINGA's init methods (src/utils/param.cc)."""
import math

import numpy as np

from singa.device import assign, same_place
from singa.device.footprint import check_fits
from singa.errors import ConfigError
from singa.proto import job_pb2


class Param:
    """Values `data`, gradient `grad`, `version` (updates seen, -1 before init) and the conf.

    Shared params (`share_from`, replicas) point `data` at the owner's array (on the owner's
    device; a copy of their own on another) and set `owner` to the owner's id; only owners are
    checkpointed and updated. A param of a layer
    partitioned on dim 1 holds one piece of the whole: `partition` = (axis, k, parts) says it is
    piece `k` of `parts` along `axis`, rows `cut(whole, parts, k)` (None: the whole param).
    `updated_by_layer`: values the layer itself updates in its forward pass (Caffe's BatchNorm
    running sums), not the updater: the worker keeps and checkpoints them and never sends
    them to the servers for an update (whose answer would overwrite them).
    """

    updated_by_layer = False

    def __init__(self, proto):
        self.proto = proto
        self.name = proto.name
        self.lr_scale = proto.lr_scale
        self.wd_scale = proto.wd_scale
        self.data = None
        self.grad = None
        self.version = -1
        self.last_version = -1
        self.id = -1
        self.owner = -1
        self.partition = None

    def setup(self, shape, xp=np):
        """Allocate zeroed values and gradient of `shape` with array module `xp` (numpy or
        cupy); ConfigError if the two would not fit in this machine's memory (a typo such as
        `num_output: 2000000000`; `singa.device.footprint.check_fits`)."""
        check_fits(2 * 4 * math.prod(shape),
                   f"param '{self.name}' of shape {tuple(shape)}: its values and gradient need")
        self.data = xp.zeros(shape, np.float32)
        self.grad = xp.zeros(shape, np.float32)

    @property
    def shape(self):
        return self.data.shape

    @property
    def size(self):
        return self.data.size

    @property
    def is_owner(self):
        return self.owner == self.id

    def share_data_from(self, other, grad=False):
        """Use `other`'s values (and gradient if `grad`) in place: SINGA's ShareDataFrom. On
        another device than `other`'s, its values stay its own (a copy, which the servers'
        answers fill as they fill `other`'s); `other`'s owner is its owner either way."""
        if other.data.shape != self.data.shape:
            raise ConfigError(f"param '{self.name}' of shape {self.data.shape} cannot share "
                              f"'{other.name}' of shape {other.data.shape}")
        if same_place(self.data, other.data):
            self.data = other.data
            if grad:
                self.grad = other.grad
        elif grad:
            raise ValueError(f"param '{self.name}' cannot share a gradient on another device")
        self.owner = other.owner

    def init_values(self, rng, version=0):
        """Fill `data` from the conf's `init` and set `version`."""
        assign(self.data, fill(self.proto.init, self.data.shape, rng, self.name))
        self.version = version

    def __repr__(self):
        return f"Param({self.name!r}, shape={None if self.data is None else self.data.shape}, v={self.version})"


def cut(n, parts, k):
    """Rows [start, stop) of piece `k` when `n` rows are cut into `parts` pieces: the first
    `n % parts` pieces get one row more (numpy's array_split)."""
    q, r = divmod(n, parts)
    start = k * q + min(k, r)
    return start, start + q + (k < r)


def piece(whole, partition):
    """The piece (axis, k, parts) of the `whole` values (`whole` itself for None)."""
    if partition is None:
        return whole
    axis, k, parts = partition
    return whole.take(range(*cut(whole.shape[axis], parts, k)), axis=axis)


def joined_shape(shapes, axis):
    """The shape of pieces of `shapes` joined along `axis`."""
    return shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1:]


def init_params(params, rng, version, graph=None, skip=()):
    """Draw the initial values of `params` from `rng` and set their `version`.

    `params` may be pieces of model-partitioned params: given `graph`, the params of every
    partition in the net's order, each owner param of it not named in `skip` is drawn whole,
    in that order, and `params` keep their pieces, so the partitions start from the values one
    worker draws (SINGA draws each piece on its own)."""
    if graph is None:
        for p in params:
            p.init_values(rng, version)
        return
    mine = {p.name: p for p in params}
    for name in dict.fromkeys(q.name for q in graph if q.is_owner):
        if name in skip:
            continue
        pieces = [q for q in graph if q.name == name and q.is_owner]
        whole = pieces[0].shape if pieces[0].partition is None else \
            joined_shape([q.shape for q in pieces], pieces[0].partition[0])
        values = fill(pieces[0].proto.init, whole, rng, name)
        p = mine.get(name)
        if p is not None:
            assign(p.data, piece(values, p.partition))
            p.version = version


def fill(gen, shape, rng, name=""):
    """Values drawn per ParamGenProto `gen` (SINGA's ParamGenerator::Fill), as float32."""
    t = gen.type
    if t == job_pb2.kConstant:
        return np.full(shape, gen.value, np.float32)
    if t in (job_pb2.kGaussian, job_pb2.kGaussianSqrtFanIn):
        v = rng.normal(gen.mean, gen.std, shape)
    elif t in (job_pb2.kUniform, job_pb2.kUniformSqrtFanIn, job_pb2.kUniformSqrtFanInOut):
        v = rng.uniform(gen.low, gen.high, shape)
    else:
        raise ConfigError(f"param '{name}' has no usable init method "
                          f"({job_pb2.InitMethod.Name(t)}); set init {{ type: ... }}")
    if gen.value != 1:
        v *= gen.value
    if t in (job_pb2.kGaussianSqrtFanIn, job_pb2.kUniformSqrtFanIn, job_pb2.kUniformSqrtFanInOut):
        if len(shape) != 2:
            raise ConfigError(f"param '{name}': {job_pb2.InitMethod.Name(t)} needs a 2-D param, "
                              f"got shape {tuple(shape)}")
        if t == job_pb2.kGaussianSqrtFanIn:
            v /= np.sqrt(shape[1])
        elif t == job_pb2.kUniformSqrtFanIn:
            v /= np.sqrt(shape[1] / 3.0)
        else:
            v /= np.sqrt(shape[0] + shape[1])
    return v.astype(np.float32)
