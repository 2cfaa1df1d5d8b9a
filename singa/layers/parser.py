"""SINGA 0.1's data path, deprecated in 0.3 but run by its `-v0.1.0` confs: ShardData (and
LMDBData, over a Caffe LMDB) reads the records of a shard, parser layers (Mnist, Label,
RGBImage) turn them into blobs (src/neuralnet/input_layer/deprecated.cc)."""
import numpy as np
from singa import resolve
from singa.errors import ConfigError, DataError
from singa.io.records import decode_batch, parse_record, read_mean
from singa.io.store import open_store
from singa.layers.base import Layer, register
from singa.layers.input import ImagePreprocessLayer, StoreInputLayer, partition_rows
from singa.proto import job_pb2

__all__ = ["ShardDataLayer", "LMDBDataLayer", "MnistLayer", "LabelLayer", "RGBImageLayer"]


@register(job_pb2.kShardData)
class ShardDataLayer(StoreInputLayer):
    """Reads sharddata_conf.batchsize records per call from the kvfile `path` (a 0.1 shard
    folder holding shard.dat, or a file), wrapping around; values are 0.1 Records or 0.3
    RecordProtos. data (N, *record shape) = raw pixels or floats; aux_data = labels.

    The batch is divided by num_partitions on partition_dim 0 (partition k keeps its rows of
    each whole batch); U{0..random_skip} records are skipped on the first read.
    """

    field, default_backend = "sharddata_conf", "kvfile"

    def setup(self, srclayers):
        dc = getattr(self.conf, self.field)
        n = dc.batchsize
        if self.conf.partition_dim == 0:
            n //= self.conf.num_partitions
        if n <= 0:
            raise ConfigError(f"layer '{self.name}': batch size {n} must be positive")
        self.backend = self.default_backend
        self.path = resolve(dc.path)
        with open_store(self.backend, self.path, "read") as store:
            first = store.read()
        if first is None:
            raise DataError(f"{store.path}: the {self.backend} store is empty")
        self.shape = tuple(parse_record(first[1], first[0].decode(errors="replace")).shape)
        if not self.shape or min(self.shape) <= 0:
            raise DataError(f"{self.path}: record {first[0]!r} has shape {list(self.shape)}; "
                            f"the parser layers need the image's shape")
        self.dim = int(np.prod(self.shape))
        self.data = self.xp.zeros((n,) + self.shape, np.float32)
        self.aux_data = self.xp.zeros(n, np.int32)
        self.rows = partition_rows(self.conf, n, True)
        self.mean = self.std = None
        self.reader_at_start(dc.random_skip)

    def parse(self, keys, values, flag, x):
        decode_batch(values, self.dim, keys, out=x, labels_out=self.aux_data, shape=self.shape)


@register(job_pb2.kLMDBData)
class LMDBDataLayer(ShardDataLayer):
    """ShardData over a Caffe LMDB (lmdbdata_conf: path, batchsize, random_skip), each Datum
    the record SINGA makes of it (src/neuralnet/input_layer/lmdb_data.cc): shape (channels,
    height, width), pixel bytes or float data, label; encoded Datums decoded as Caffe does."""

    field, default_backend = "lmdbdata_conf", "lmdb"


def shard_source(layer, srclayers):
    """The one ShardData layer a parser layer reads."""
    if len(srclayers) != 1 or not isinstance(srclayers[0], ShardDataLayer):
        raise ConfigError(f"layer '{layer.name}' parses records: its one srclayer must be a "
                          f"kShardData or kLMDBData layer")
    return srclayers[0]


@register(job_pb2.kMnist)
class MnistLayer(Layer):
    """data (N, 1, s, s) = x / norm_a − norm_b, for records of shape (..., s, s)."""

    one_to_many = True

    def setup(self, srclayers):
        src = shard_source(self, srclayers)
        if len(src.shape) < 2 or src.shape[-1] != src.shape[-2]:
            raise DataError(f"{src.path}: kMnist layer '{self.name}' needs square images, the "
                            f"records have shape {list(src.shape)}")
        s = src.shape[-1]
        self.data = self.xp.zeros((len(src.data), 1, s, s), np.float32)
        mc = self.conf.mnist_conf
        self.norm_a, self.norm_b = np.float32(mc.norm_a), np.float32(mc.norm_b)

    def compute_feature(self, flag, srclayers):
        np.divide(srclayers[0].data.reshape(self.data.shape), self.norm_a, out=self.data)
        self.data -= self.norm_b
        self.publish()


@register(job_pb2.kLabel)
class LabelLayer(Layer):
    """data (N,) = the records' labels as floats; aux_data = the labels (for the loss layer)."""

    one_to_many = True

    def setup(self, srclayers):
        src = shard_source(self, srclayers)
        self.data = self.xp.zeros(len(src.data), np.float32)
        self.aux_data = self.xp.zeros(len(src.data), np.int32)

    def compute_feature(self, flag, srclayers):
        np.copyto(self.aux_data, srclayers[0].aux_data)
        np.copyto(self.data, self.aux_data)
        self.publish()


@register(job_pb2.kRGBImage)
class RGBImageLayer(ImagePreprocessLayer):
    """data = scale·crop(x − mean) for records of shape (C, S, S): ImagePreprocess after the
    mean of rgbimage_conf.meanfile is subtracted.

    meanfile: a serialized record of C·S·S floats (0.1's image_mean.bin), a kvfile holding one
    under the key "mean" (0.3's create_data), or a Caffe CaffeBlob when the name contains
    "binaryproto". SINGA 0.1 draws crop offsets from the channel count and writes past its
    blob when it does not crop outside training; here crops are ImagePreprocess's.
    """

    computes_on_gpu = False

    def setup(self, srclayers):
        src = shard_source(self, srclayers)
        ImagePreprocessLayer.setup(self, srclayers)
        meanfile = self.conf.rgbimage_conf.meanfile
        self.mean = None
        if meanfile:
            self.mean = read_mean(resolve(meanfile), src.shape)
            self._centred = np.empty_like(src.data)

    def compute_feature(self, flag, srclayers):
        x = srclayers[0].data
        if self.mean is not None:
            x = np.subtract(x, self.mean, out=self._centred)
        self.transform(flag, x)
