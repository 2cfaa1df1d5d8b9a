"""Input layers reading a store batch by batch: RecordInput and CSVInput (src/neuralnet/input_layer/)."""
import numpy as np

from singa.config import resolve
from singa.errors import ConfigError, DataError
from singa.io.records import decode_batch
from singa.io.store import open_store
from singa.layers.base import Layer, register
from singa.proto import job_pb2

__all__ = ["RecordInputLayer", "CSVInputLayer"]


class StoreInputLayer(Layer):
    """Reads `batchsize` tuples per call from store_conf's store, wrapping around at its end.

    data (N, *shape) float32 = (x − mean) / std; aux_data (N,) int32 labels. On the first
    read it skips U{0..random_skip} tuples drawn from `rng`. `get_state` / `set_state` save
    and restore the read position for bit-exact resume.
    """

    one_to_many = True
    default_backend = None

    def setup(self, srclayers):
        sc = self.conf.store_conf
        self.backend = sc.backend or self.default_backend
        for field, value in (("backend", self.backend), ("path", sc.path)):
            if not value:
                raise ConfigError(f"layer '{self.name}': store_conf.{field} is not set")
        if not sc.shape or min(sc.shape) <= 0:
            raise ConfigError(f"layer '{self.name}': store_conf.shape must list positive sizes, "
                              f"got {list(sc.shape)}")
        n = batchsize(self.conf)
        self.path = resolve(sc.path)
        self.shape = tuple(sc.shape)
        self.dim = int(np.prod(self.shape))
        self.data = np.zeros((n,) + self.shape, np.float32)
        self.aux_data = np.zeros(n, np.int32)
        self.mean = self._constant_or_file("mean", 0.0)
        self.std = self._constant_or_file("std", 1.0)
        self.store = None
        self.skipped = False

    def compute_feature(self, flag, srclayers):
        if self.store is None:
            self.store = open_store(self.backend, self.path, "read")
        if not self.skipped:
            for _ in range(self.rng.integers(0, self.conf.store_conf.random_skip + 1)):
                self._next()
            self.skipped = True
        keys, values = zip(*(self._next() for _ in range(len(self.aux_data))))
        x = self.data.reshape(len(values), self.dim)
        self.parse(keys, values, flag, x)
        if self.mean is not None:
            x -= self.mean
        if self.std is not None:
            x /= self.std

    def get_state(self):
        """{"offset": byte offset of the next tuple, "skipped": whether random_skip was done}."""
        return {"offset": 0 if self.store is None else self.store.tell(), "skipped": self.skipped}

    def set_state(self, offset, skipped):
        """Continue reading at `offset`; a resumed reader does not skip again if `skipped`."""
        if self.store is None:
            self.store = open_store(self.backend, self.path, "read")
        self.store.seek(offset)
        self.skipped = skipped

    def parse(self, keys, values, flag, x):
        """Fill x (N, dim) and aux_data from the batch's store values."""
        raise NotImplementedError

    def _next(self):
        kv = self.store.read()
        if kv is None:
            self.store.seek_to_first()
            kv = self.store.read()
            if kv is None:
                raise DataError(f"{self.path}: the {self.backend} store is empty")
        return kv

    def _constant_or_file(self, what, identity):
        """The (dim,) mean or std from store_conf's {what}_file / {what}_value, None if unset."""
        sc = self.conf.store_conf
        if sc.HasField(what + "_file"):
            path = resolve(getattr(sc, what + "_file"))
            with open_store(self.backend, path, "read") as store:
                kv = store.read()
            if kv is None:
                raise DataError(f"{path}: {what} file is empty")
            return self.parse_vector(path, kv)
        if sc.HasField(what + "_value") and getattr(sc, what + "_value") != identity:
            return np.float32(getattr(sc, what + "_value"))
        return None

    def parse_vector(self, path, kv):
        """The (dim,) float32 vector held by a mean/std file's first tuple `kv`."""
        raise NotImplementedError


def batchsize(conf):
    """SINGA's batch rule: on partition_dim 0 one size is split evenly, several go per partition."""
    sizes = conf.store_conf.batchsize
    if not sizes:
        raise ConfigError(f"layer '{conf.name}': store_conf.batchsize is not set")
    if conf.partition_dim == 0:
        if len(sizes) == 1:
            n = sizes[0] // conf.num_partitions
        elif conf.partition_id < len(sizes):
            n = sizes[conf.partition_id]
        else:
            raise ConfigError(f"layer '{conf.name}': store_conf.batchsize lists {len(sizes)} "
                              f"sizes but partition {conf.partition_id} needs one")
    else:
        n = sizes[0]
    if n <= 0:
        raise ConfigError(f"layer '{conf.name}': batch size {n} must be positive")
    return n


@register(job_pb2.kRecordInput)
class RecordInputLayer(StoreInputLayer):
    """Values are RecordProto: `data` floats if present, else `pixel` bytes; label → aux_data."""

    def parse(self, keys, values, flag, x):
        decode_batch(values, self.dim, keys, out=x, labels_out=self.aux_data, shape=self.shape)

    def parse_vector(self, path, kv):
        x, _ = decode_batch([kv[1]], self.dim, [kv[0]], shape=self.shape)
        return x[0]


@register(job_pb2.kCSVInput)
class CSVInputLayer(StoreInputLayer):
    """Lines `label,v1,...,vD` (without the label when has_label is false or in kDeploy)."""

    default_backend = "textfile"

    def parse(self, keys, values, flag, x):
        has_label = self.conf.store_conf.has_label and not flag & job_pb2.kDeploy
        width = self.dim + has_label
        table = self._floats(keys, values, width).reshape(len(values), width)
        if has_label:
            labels = table[:, 0]
            bad = ~(np.abs(labels) < 2**31)     # nan, inf and what std::stoi cannot hold
            if bad.any():
                raise DataError(f"{self.path}: label {labels[bad][0]} in the batch from line "
                                f"{_text(keys[0])} is not an int")
            # std::stoi of the label token: truncation toward zero.
            self.aux_data[...] = labels
        x[...] = table[:, has_label:]

    def parse_vector(self, path, kv):
        return self._floats([kv[0]], [kv[1]], self.dim)

    def _floats(self, keys, lines, width):
        """All separated values of `lines`, each of which must hold `width` of them, as float32."""
        sep = self.conf.store_conf.separator[:1].encode() or b","
        tokens = sep.join(lines).split(sep)
        if len(tokens) != width * len(lines):
            for key, line in zip(keys, lines):
                if line.count(sep) + 1 != width:
                    raise DataError(f"{self.path}: line {_text(key)} has {line.count(sep) + 1} "
                                    f"values, expected {width}")
        try:
            return np.array(tokens, dtype=np.float32)
        except ValueError as e:
            raise DataError(f"{self.path}: {e} in the batch from line {_text(keys[0])}") from None


def _text(key):
    return key.decode(errors="backslashreplace") if isinstance(key, bytes) else str(key)
