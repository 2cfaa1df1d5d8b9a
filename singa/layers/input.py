"""Input layers: RecordInput and CSVInput read a store batch by batch; ImagePreprocess crops, mirrors and scales images (src/neuralnet/input_layer/)."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from singa import resolve
from singa.errors import ConfigError, DataError
from singa.io.records import decode_batch, parse_record, read_mean, uniform_pixels
from singa.io.store import CAFFE_BACKENDS, open_store, read_batch, read_columns
from singa.layers import kernels
from singa.layers.base import Layer, register, type_name
from singa.proto import job_pb2

__all__ = ["RecordInputLayer", "CSVInputLayer", "ImagePreprocessLayer"]


class StoreInputLayer(Layer):
    """Reads `batchsize` tuples per call from store_conf's store, wrapping around at its end.

    data (N, *shape) float32 = (x − mean) / std; aux_data (N,) int32 labels; with
    store_conf.target_dim k, `targets` (N, k) float32 (the records' regression targets; a
    layer of ours that reads them, RecordInput: `reads_targets`). On the first
    read a shuffling store draws its order from `rng`, then U{0..random_skip} tuples are
    skipped (also drawn from `rng`). Caffe's stores (lmdb, imagelist) may leave `shape` unset:
    their first record gives it. `position` / `seek` save
    and restore the read position for bit-exact resume. Partition k of K on partition_dim 0
    with one batchsize B reads every batch of B and keeps its rows [k·B/K, (k+1)·B/K), so the K
    partitions together see the batches one worker sees (SINGA's partitions each read from
    the start of the store and rely on random_skip to differ).

    On a GPU, where only layers there read it, a batch of pixel records goes to the device
    as its bytes (a quarter of the floats), and the device computes (x − mean) / std into
    `mirror`, the host's float32 operations bit for bit; `data` is then not computed. There,
    and from Caffe's stores (lmdb, imagelist: images to decode; `read_ahead`), the next batch
    is read ahead in a thread of the layer's own while the net computes. `position` stays
    that of the batches used.
    """

    one_to_many = True
    sources = (0, 0)
    default_backend = None
    #: whether the layer reads regression targets (store_conf.target_dim)
    reads_targets = False
    #: (device pixels (N, dim) uint8, mean, std, the kernels) where the device decodes
    on_device = None
    #: the next batch being read ahead (a Future of `_read`'s), and the reading thread
    _ahead = _reads = None

    def setup(self, srclayers):
        sc = self.conf.store_conf
        self.backend = sc.backend or self.default_backend
        for field, value in (("backend", self.backend), ("path", sc.path)):
            if not value:
                raise ConfigError(f"layer '{self.name}': store_conf.{field} is not set")
        self.path = resolve(sc.path)
        shape = list(sc.shape) or (self.backend in CAFFE_BACKENDS and self._first_shape())
        if not shape or min(shape) <= 0:
            raise ConfigError(f"layer '{self.name}': store_conf.shape must list positive sizes, "
                              f"got {list(sc.shape)}")
        n = batchsize(self.conf)
        self.rows = partition_rows(self.conf, n, len(sc.batchsize) == 1)
        self.shape = tuple(shape)
        self.dim = int(np.prod(self.shape))
        self.data = self.xp.zeros((n,) + self.shape, np.float32)
        self.aux_data = self.xp.zeros(n, np.int32)
        if sc.target_dim:
            if not self.reads_targets or sc.target_dim < 0:
                raise ConfigError(f"layer '{self.name}': store_conf.target_dim {sc.target_dim}: "
                                  f"{type_name(self.conf)} reads no targets (kRecordInput "
                                  f"reads k > 0)")
            self.targets = self.xp.zeros((n, sc.target_dim), np.float32)
        self.mean = self._constant_or_file("mean", 0.0)
        self.std = self._constant_or_file("std", 1.0)
        self.reader_at_start(sc.random_skip)

    def reader_at_start(self, random_skip):
        """Nothing opened yet, U{0..random_skip} tuples to skip at the first read; Caffe's
        stores (their images take long to decode) read the next batch ahead (`read_ahead`)."""
        self.random_skip = random_skip
        self.read_ahead = self.backend in CAFFE_BACKENDS
        self.store, self.skipped = None, False
        self._offset = 0        # the store's offset after the batches used

    def compute_feature(self, flag, srclayers):
        if self.store is None:
            self.store = self._open()
        if not self.skipped:
            if hasattr(self.store, "start"):
                self.store.start(self.rng)
            for _ in range(self.rng.integers(0, self.random_skip + 1)):
                self._next(1)
            self.skipped = True
        ahead, self._ahead = self._ahead, None
        keys, values, pixels, labels, self._offset = ahead.result() if ahead else self._read()
        if pixels is not None or self.read_ahead:
            if self._reads is None:
                self._reads = ThreadPoolExecutor(1, thread_name_prefix=f"read {self.name}")
            self._ahead = self._reads.submit(self._read)
        if pixels is not None:
            self.to_device(pixels, labels)
            return
        x = self.data.reshape(len(values), self.dim)
        self.parse(keys, values, flag, x)
        if self.mean is not None:
            x -= self.mean
        if self.std is not None:
            x /= self.std
        self.publish()

    def make_mirror(self, device, host_read):
        super().make_mirror(device, host_read)
        if not host_read:
            xp, n = device.xp, len(self.data)
            mean, std = (xp.asarray(np.ascontiguousarray(np.broadcast_to(
                np.float32(identity) if v is None else v, self.dim)))
                for v, identity in ((self.mean, 0), (self.std, 1)))
            self.on_device = (xp.empty((n, self.dim), np.uint8), mean, std, kernels.choose(device))

    def close(self):
        """The store closed and the reading thread ended; `position` still says where the
        batches used end."""
        self._offset = self.position()[0]
        self._forget_ahead()
        if self._reads is not None:
            self._reads.shutdown()
            self._reads = None
        if self.store is not None:
            self.store.close()
            self.store = None

    def _read(self):
        """The next batch: (keys, values, its pixels (N, dim) uint8 where it holds pixel
        records laid out alike on a layer that decodes on the device, else None; their labels
        (N,) int32; the store's offset after the batch)."""
        before, stop, after = self.rows
        keys, values = read_columns(self.store, stop + after, self.path, self.backend)
        keys, values = keys[before:stop], values[before:stop]
        labels = np.empty(len(values), np.int32)
        pixels = self.pixels(values, labels) if self.on_device else None
        return keys, values, pixels, labels, self.store.tell()

    def to_device(self, pixels, labels):
        """mirror = (pixels − mean) / std on the device, aux_data and aux_mirror = labels. x − 0
        and x / 1 are exact, so an unset mean or std costs no bits."""
        dev, mean, std, gpu = self.on_device
        self.aux_data[:] = labels
        self.uploads(dev, pixels)
        self.uploads(self.aux_mirror, self.aux_data)
        gpu.normalize_pixels(dev, mean, std, self.mirror.reshape(dev.shape))

    def pixels(self, values, labels):
        """The batch's pixels (N, dim) uint8 with `labels` filled, where the values are laid
        out for that; None otherwise (and always here: RecordInput's can be)."""
        return None

    def position(self):
        """(byte offset of the next tuple not used, whether random_skip was done): where `seek`
        resumes."""
        if self.store is None:
            return self._offset, self.skipped
        return self._offset if self._ahead else self.store.tell(), self.skipped

    def seek(self, offset, skipped):
        """Continue reading at `offset`; a resumed reader does not skip again if `skipped`."""
        self._forget_ahead()
        if self.store is None:
            self.store = self._open()
        self.store.seek(offset)
        self.skipped = skipped

    def _forget_ahead(self):
        """Wait for the batch being read ahead, if any, and forget it (its error too)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.exception()

    def parse(self, keys, values, flag, x):
        """Fill x (N, dim) and aux_data from the batch's store values."""
        raise NotImplementedError

    def _next(self, n):
        """The store's next `n` (key, value) pairs, wrapping around."""
        return read_batch(self.store, n, self.path, self.backend)

    def _open(self):
        return open_store(self.backend, self.path, "read", self.conf.store_conf)

    def _first_shape(self):
        """The shape of the store's first record (Caffe's stores: the first Datum or image)."""
        with self._open() as store:
            kv = store.read()
        if kv is None:
            raise DataError(f"{self.path}: the {self.backend} store is empty")
        return list(parse_record(kv[1], kv[0]).shape)

    def _constant_or_file(self, what, identity):
        """The mean or std, float32: (dim,) from store_conf's {what}_file, a scalar from its
        {what}_value; None if unset. A std of 0 anywhere is refused (x / 0 is no input)."""
        sc = self.conf.store_conf
        if sc.HasField(what + "_file"):
            path = resolve(getattr(sc, what + "_file"))
            if self.backend in CAFFE_BACKENDS:     # Caffe's mean files: a BlobProto
                return read_mean(path, self.shape).reshape(-1)
            with open_store(self.backend, path, "read") as store:
                kv = store.read()
            if kv is None:
                raise DataError(f"{path}: {what} file is empty")
            v = self.parse_vector(path, kv)
            if what == "std" and not v.all():
                raise DataError(f"{path}: the std file holds 0 at index {np.argmin(v != 0)}: "
                                f"an input divided by it is no number")
            return v
        if sc.HasField(what + "_value") and getattr(sc, what + "_value") != identity:
            if what == "std" and sc.std_value == 0:
                raise ConfigError(f"layer '{self.name}': store_conf.std_value must not be 0 "
                                  f"(inputs are divided by it)")
            return np.float32(getattr(sc, what + "_value"))
        return None

    def parse_vector(self, path, kv):
        """The (dim,) float32 vector held by a mean/std file's first tuple `kv`."""
        raise NotImplementedError


def partition_rows(conf, n, shared):
    """(tuples skipped before this partition's `n` rows, its last row, tuples skipped after):
    on partition_dim 0 a `shared` batch size is read whole by every partition."""
    k, parts = conf.partition_id, conf.num_partitions
    if conf.partition_dim == 0 and parts > 1 and shared:
        return k * n, (k + 1) * n, (parts - 1 - k) * n
    return 0, n, 0


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
    """Values are RecordProto: `data` floats if present, else `pixel` bytes; label → aux_data,
    `target` → targets (store_conf.target_dim)."""

    reads_targets = True

    def parse(self, keys, values, flag, x):
        try:
            decode_batch(values, self.dim, keys, out=x, labels_out=self.aux_data, shape=self.shape,
                         targets_out=self.targets)
        except DataError as e:
            raise DataError(f"{self.path}: {e}") from None

    def pixels(self, values, labels):
        # targets are read record by record (parse), with the pixels
        return None if self.targets is not None else uniform_pixels(values, self.dim, labels)

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


@register(job_pb2.kImagePreprocess)
class ImagePreprocessLayer(Layer):
    """y = scale·crop(x), x of shape (N, C, H, W) and rgbimage_conf's cropsize s (0: no crop).

    In kTrain each image is cropped at offsets h ~ U{0..H−s}, w ~ U{0..W−s} and, with
    `mirror`, flipped left-right with probability ½ (draws from `rng`); other phases crop the
    top-left corner, as SINGA does, or with `center_crop` (ours) the centre ((H−s)/2, (W−s)/2,
    Caffe's), and never mirror. `meanfile` is ignored, as in SINGA 0.3. SINGA needs H == W;
    here a crop needs only s ≤ H, W.

    On a GPU it computes there (`computes_on_gpu`): the host draws the offsets, and one kernel
    crops, flips and scales, so its input layer's batch goes to the device as its bytes and
    the pixels are never floats on the host.
    """

    one_to_many = True
    computes_on_gpu = True

    sources = (1, 1)

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        rc = self.conf.rgbimage_conf
        if src.ndim != 4:
            raise ConfigError(f"layer '{self.name}' needs images (N, C, H, W) from "
                              f"'{srclayers[0].name}', got shape {src.shape}")
        if not 0 <= rc.cropsize <= min(src.shape[2:]):
            raise ConfigError(f"layer '{self.name}': rgbimage_conf.cropsize {rc.cropsize} must "
                              f"be in [0, {min(src.shape[2:])}] (the image size)")
        if rc.scale == 0:
            raise ConfigError(f"layer '{self.name}': rgbimage_conf.scale must not be 0")
        self.crop = (rc.cropsize,) * 2 if rc.cropsize else src.shape[2:]
        self.scale = np.float32(rc.scale)
        self.data = self.xp.zeros(src.shape[:2] + self.crop, np.float32)
        self.at = self.xp.zeros((3, len(src)), np.int32)      # each image's (h, w, flip)
        self.kernels = kernels.choose(self.device)

    def compute_feature(self, flag, srclayers):
        self.transform(flag, srclayers[0].data_for(self))

    def transform(self, flag, x):
        """data = scale·crop(x), the crop random in kTrain."""
        (ch, cw), n = self.crop, len(x)
        span_h, span_w = x.shape[2] - ch, x.shape[3] - cw
        at = np.zeros((3, n), np.int32)
        if flag & job_pb2.kTrain:
            at[0] = self.rng.integers(0, span_h + 1, n)
            at[1] = self.rng.integers(0, span_w + 1, n)
            if self.conf.rgbimage_conf.mirror:
                at[2] = self.rng.integers(0, 2, n)
        elif self.conf.rgbimage_conf.center_crop:
            at[0], at[1] = span_h // 2, span_w // 2
        self.uploads(self.at, at)
        self.kernels.crop_mirror(x, self.at, self.scale, self.data)
        self.publish()


def _text(key):
    return key.decode(errors="backslashreplace") if isinstance(key, bytes) else str(key)
