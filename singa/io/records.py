"""Store values: decode RecordProto (0.2/0.3) and 0.1 Record{image} into float32 (src/io/),
and write numpy samples as a kvfile of RecordProto, as SINGA's create_data does.

What a sample is compared with rides in its record: a class label in `label` (SINGA's field,
an int), or regression targets (numpy y of a float dtype holding other than integers, or any y
a mean squared error reads: Keras' targets) as the floats of `target`, a field of ours (300)
that SINGA 0.3 skips as unknown; such a record leaves `label` unset (SINGA reads 0). Float y
holding integers only (Keras' one-hot rows of to_categorical) stay class labels unless asked. An input layer whose store_conf.target_dim is k
reads k targets from every record (`decode_batch`'s targets_out).
"""
import numpy as np
from google.protobuf.message import DecodeError

from singa.errors import ConfigError, DataError
from singa.files import write_atomic
from singa.io.kvfile import KVFile, pack
from singa.proto import common_pb2

__all__ = ["Sample", "Samples", "record_values", "decode_batch", "uniform_pixels", "parse_record",
           "class_indices", "holds_targets", "targets_of", "encode_record", "write_records",
           "read_mean"]


def record_values(value, shape, key=b""):
    """(x float32 of `shape`, label) from one store value.

    x = data if the record has floats, else its pixel bytes as uint8; the element count must
    equal prod(shape).
    """
    shape = tuple(shape)
    x = np.empty(shape, np.float32)
    labels = np.empty(1, np.int32)
    decode_batch([value], x.size, [key], out=x.reshape(1, -1), labels_out=labels, shape=shape)
    return x, int(labels[0])


class Sample:
    """A record handed out unserialized (by the memory store): its values `x`, a numpy row
    of uint8 or other numbers, and its `label`, or its `target` floats. `decode_batch` reads a
    batch of them to the bits it reads of the RecordProto bytes `encode_record` makes of them,
    without that round trip (which cost a small net half of its step)."""

    __slots__ = ("x", "label", "target")

    def __init__(self, x, label=0, target=None):
        self.x, self.label, self.target = x, label, target


class Samples:
    """Consecutive `Sample`s as arrays (the memory store's batch): rows `x` (N, ...), and per
    row its label (`labels` (N,)) or its target floats (`targets` (N, k), labels None). A
    sequence of Samples, which `decode_batch` and `uniform_pixels` read whole: a batch's
    values cast at once, not a Python object and a row of a stack per sample (a small net's
    input layer spent most of a third of its step so)."""

    __slots__ = ("x", "labels", "targets")

    def __init__(self, x, labels=None, targets=None):
        self.x, self.labels, self.targets = x, labels, targets

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Samples(self.x[i], None if self.labels is None else self.labels[i],
                           None if self.targets is None else self.targets[i])
        if self.targets is not None:
            return Sample(self.x[i], target=self.targets[i])
        return Sample(self.x[i], self.labels[i])

    @staticmethod
    def join(parts):
        """The Samples of `parts` one after the other (itself for one)."""
        if len(parts) == 1:
            return parts[0]

        def joined(arrays):
            return None if arrays[0] is None else np.concatenate(arrays)
        return Samples(np.concatenate([p.x for p in parts]), joined([p.labels for p in parts]),
                       joined([p.targets for p in parts]))


def decode_batch(values, dim, keys=None, out=None, labels_out=None, shape=None,
                 targets_out=None):
    """(x float32 (N, dim), labels int32 (N,)) from N store values (RecordProto bytes, or
    `Sample`s).

    `out` / `labels_out` are filled in place when given (the input layer's preallocated blobs);
    `targets_out` (N, k) float32, when given, with each record's k `target` floats (DataError
    for a record holding another number of them). `keys` and `shape` only make error messages
    precise.
    """
    n = len(values)
    x = np.empty((n, dim), np.float32) if out is None else out
    labels = np.empty(n, np.int32) if labels_out is None else labels_out
    if isinstance(values, Samples):
        _decode_rows(values, dim, keys, x, labels, shape, targets_out)
        return x, labels
    if n and isinstance(values[0], Sample):
        _decode_samples(values, dim, [b""] * n if keys is None else keys, x, labels, shape,
                        targets_out)
        return x, labels
    pixels = None if targets_out is not None else uniform_pixels(values, dim, labels)
    if pixels is None:
        _decode_each(values, dim, [b""] * n if keys is None else keys, x, labels, shape,
                     targets_out)
    else:
        x[...] = pixels
    return x, labels


def uniform_pixels(values, dim, labels):
    """The pixels (N, dim) uint8, sliced out of the joined values, with `labels` filled, if
    all are laid out as the first: as SINGA and encode_record write pixel records (shape,
    label, pixel in field order), of the same byte length and a one-byte label (0..127); None,
    nothing written, otherwise.

    Each value then equals the first but for its label byte and its pixels, so protobuf would
    parse it to the first's shape, that label and those pixels.
    """
    if isinstance(values, Samples):
        if values.x.dtype != np.uint8 or values.x[0].size != dim:
            return None
        labels[:] = 0 if values.labels is None else values.labels
        return values.x.reshape(len(values), dim)
    if values and isinstance(values[0], Sample):
        if values[0].x.dtype != np.uint8 or any(v.x.size != dim for v in values):
            return None
        labels[:] = [v.label for v in values]
        return np.stack([v.x.reshape(-1) for v in values])
    if not values or len(set(map(len, values))) != 1:
        return None
    try:
        rec = common_pb2.RecordProto.FromString(values[0])
    except DecodeError:
        return None
    layout = common_pb2.RecordProto(shape=rec.shape, label=rec.label, pixel=rec.pixel)
    if len(rec.pixel) != dim or values[0] != layout.SerializeToString():
        return None
    rows = np.frombuffer(b"".join(values), np.uint8).reshape(len(values), -1)
    head = rows[:, :rows.shape[1] - dim]
    at = common_pb2.RecordProto(shape=rec.shape).ByteSize() + 1    # after the label's tag
    same = head == head[0]
    same[:, at] = head[:, at] < 128
    if not same.all():
        return None
    labels[:] = head[:, at]
    return rows[:, head.shape[1]:]


def _decode_samples(samples, dim, keys, x, labels, shape, targets=None):
    """`_decode_each` of `Sample`s: each row converted to float32 as `encode_record` does."""
    for key, sample in zip(keys, samples):
        _check_size(key, sample.x.size, dim, shape)
    x[...] = np.stack([s.x.reshape(-1) for s in samples])
    labels[:] = [0 if s.target is not None else s.label for s in samples]
    if targets is None:
        return
    for i, (key, sample) in enumerate(zip(keys, samples)):
        target = np.zeros(0, np.float32) if sample.target is None else sample.target
        _check_targets(key, target.size, targets.shape[1])
        targets[i] = target.reshape(-1)


def _decode_rows(samples, dim, keys, x, labels, shape, targets=None):
    """`_decode_samples` of `Samples`: the rows cast at once (the same bits)."""
    n = len(samples)
    if n:
        _check_size(b"" if keys is None else keys[0], samples.x[0].size, dim, shape)
    x[...] = samples.x.reshape(n, dim)
    labels[:] = 0 if samples.labels is None else samples.labels
    if targets is None:
        return
    k = 0 if samples.targets is None else samples.targets.shape[1]
    if n:
        _check_targets(b"" if keys is None else keys[0], k, targets.shape[1])
    targets[...] = 0 if samples.targets is None else samples.targets


def _check_size(key, size, dim, shape):
    """DataError naming record `key` unless it holds `dim` values."""
    if size != dim:
        want = f"{dim} (shape {list(shape)})" if shape else f"{dim}"
        raise DataError(f"record {_text(key)!r} has {size} values, expected {want}")


def _check_targets(key, size, k):
    """DataError naming record `key` unless it holds the layer's `k` targets."""
    if size != k:
        raise DataError(f"record {_text(key)!r} has {size} targets, expected {k} "
                        f"(store_conf.target_dim)")


def _decode_each(values, dim, keys, x, labels, shape, targets=None):
    """Fill x and labels (and targets) record by record, naming the first bad one; pixels
    converted at once."""
    pixel_rows, pixels = [], []
    for i, (key, value) in enumerate(zip(keys, values)):
        rec = parse_record(value, key)
        row = rec.data or rec.pixel
        _check_size(key, len(row), dim, shape)
        if type(row) is bytes:
            pixel_rows.append(i)
            pixels.append(row)
        else:
            x[i] = row
        labels[i] = rec.label
        if targets is not None:
            _check_targets(key, len(rec.target), targets.shape[1])
            targets[i] = rec.target
    if pixels:
        x[pixel_rows] = np.frombuffer(b"".join(pixels), np.uint8).reshape(len(pixels), dim)


def parse_record(value, key=""):
    """The RecordProto of a store value under `key`: a 0.2/0.3 RecordProto or a 0.1
    Record{image}."""
    try:
        rec = common_pb2.RecordProto.FromString(value)
        if not rec.pixel and not rec.data:
            # A 0.1 shard wraps the record: Record{type, image = SingleLabelImageRecord}.
            wrapper = common_pb2.Record.FromString(value)
            if wrapper.HasField("image"):
                rec = wrapper.image
    except DecodeError:
        raise DataError(f"record {_text(key)!r} is not a RecordProto ({len(value)} "
                        f"bytes)") from None
    return rec


def _text(key):
    """A store key (bytes, or str from some backends) as text for messages."""
    return key.decode(errors="backslashreplace") if isinstance(key, bytes) else str(key)


def holds_targets(y):
    """Whether `y` are regression targets rather than class labels, unless told: floats that
    are not all integers (integral floats, such as Keras' one-hot rows, are labels)."""
    if y is None:
        return False
    y = np.asarray(y)
    return y.dtype.kind == "f" and not np.array_equal(y, np.round(y))


def targets_of(y, n):
    """The (n, k) float32 regression targets of `y` (shape (n,) or (n, k)); ConfigError
    otherwise."""
    y = np.asarray(y)
    if not (np.issubdtype(y.dtype, np.number) or y.dtype == bool) or y.ndim == 0:
        raise ConfigError(f"numpy data: targets y must be numbers of shape ({n},) or ({n}, k), "
                          f"got dtype {y.dtype} and shape {y.shape}")
    if len(y) != n:
        raise ConfigError(f"numpy data: {len(y)} targets for {n} samples (targets y are of "
                          f"shape ({n},) or ({n}, k))")
    t = y.reshape(n, -1).astype(np.float32)
    if not np.isfinite(t).all():
        raise ConfigError(f"numpy data: target {t[~np.isfinite(t)][0]} of sample "
                          f"{np.argmax(~np.isfinite(t).all(axis=1))} is no finite number")
    return t


def class_indices(y, n):
    """The (n,) int64 class indices of labels `y`: class indices, or one-hot rows (n, C) as
    Keras' categorical labels (each row's one 1 gives the class); ConfigError otherwise."""
    y = np.asarray(y)
    if not (np.issubdtype(y.dtype, np.number) or y.dtype == bool):
        raise ConfigError(f"numpy data: labels y must be class indices (ints), got dtype "
                          f"{y.dtype}; map them to 0..C-1 first")
    if y.ndim == 2 and y.shape[0] == n and y.shape[1] > 1:
        if not (np.isin(y, (0, 1)).all() and (y.sum(axis=1) == 1).all()):
            raise ConfigError(f"numpy data: labels y of shape {y.shape} are not one-hot rows "
                              f"(one 1 per row); give class indices of shape ({n},), or "
                              f"floats for regression targets")
        return np.argmax(y, axis=1).astype(np.int64)
    y = y.reshape(-1)
    if len(y) != n:
        raise ConfigError(f"numpy data: {len(y)} labels for {n} samples (labels y are class "
                          f"indices of shape ({n},), or one-hot rows ({n}, C))")
    if not np.issubdtype(y.dtype, np.integer) and not np.array_equal(y, np.round(y)):
        raise ConfigError("numpy data: labels y must be integers (class indices)")
    return y.astype(np.int64)


def encode_record(x, label, target=None):
    """The RecordProto bytes of one sample, as SINGA's create_data writes them: uint8 `x` as
    `pixel` bytes, other numbers as float `data`; with `target` (floats) those in `target`
    instead of a `label`."""
    if target is None:
        rec = common_pb2.RecordProto(label=int(label))
    else:
        rec = common_pb2.RecordProto(target=np.asarray(target, np.float32).reshape(-1).tolist())
    if x.dtype == np.uint8:
        rec.pixel = x.tobytes()
    else:
        rec.data.extend(x.reshape(-1).astype(np.float32).tolist())
    return rec.SerializeToString()


def write_records(path, x, y=None, target_dim=None):
    """Write numpy samples as the kvfile `path` (keys `%05d` counting from 0, SINGA's
    create_data; labels 0 when `y` is None) and return the number written. `x` is an array
    (N, ...) with labels `y` (N,: class indices, or one-hot rows; floats not all integers:
    regression targets (N,) or (N, k), written as each record's `target`), or an iterable of
    (x, y) chunks, so data larger than memory are written chunk by chunk. `target_dim` k > 0
    writes `y` as k targets whatever they hold (0 targets without y), 0 as class labels; None:
    as the first chunk's y say (`holds_targets`). The file appears whole or not at all (`singa.files.write_atomic`); an error
    names `path`."""
    chunks = [(x, y)] if isinstance(x, np.ndarray) else x
    written = 0
    decided = None if target_dim is None else target_dim > 0

    def fill(f):
        nonlocal written, decided
        for cx, cy in chunks:
            cx = np.asarray(cx)
            if decided is None and cy is not None:   # the first y decide for every chunk
                decided = holds_targets(cy)
            targets = bool(decided)
            if targets:
                cy = np.zeros((len(cx), target_dim), np.float32) if cy is None \
                    else targets_of(cy, len(cx))
                if target_dim and cy.shape[1] != target_dim:
                    raise ConfigError(f"numpy data: {cy.shape[1]} targets per sample, "
                                      f"store_conf.target_dim {target_dim}")
                records = (encode_record(cx[i], 0, cy[i]) for i in range(len(cx)))
            else:
                cy = np.zeros(len(cx), np.int64) if cy is None else class_indices(cy, len(cx))
                records = (encode_record(cx[i], cy[i]) for i in range(len(cx)))
            f.write(b"".join(pack(b"%05d" % (written + i), r) for i, r in enumerate(records)))
            written += len(cx)
    try:
        write_atomic(path, fill)
    except OSError as e:
        raise DataError(f"{path}: cannot write the records: {e.strerror}") from None
    return written


def read_mean(path, shape):
    """The mean image of `shape` from a mean file: a serialized record of its floats (0.1's
    image_mean.bin), a kvfile holding one under the key "mean" (0.3's create_data, the Caffe
    importer's mean.kvfile), or a Caffe BlobProto when the name contains "binaryproto"."""
    dim = int(np.prod(shape))
    if "binaryproto" in path:
        from singa.io.caffe_blobs import read_blob_file     # the importer's reader
        values = read_blob_file(path).values
    else:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise DataError(f"{path}: cannot read the mean file: {e.strerror}") from None
        values = _record_data(raw)
        if len(values) != dim and raw[8:12] == b"mean":    # a kvfile whose first key is "mean"
            with KVFile(path, "read") as store:
                values = _record_data(store.read()[1])
    if len(values) != dim:
        raise DataError(f"{path}: the mean file holds {len(values)} values, the images "
                        f"{dim} (shape {list(shape)})")
    return np.array(values, np.float32).reshape(shape)


def _record_data(value):
    try:
        return common_pb2.RecordProto.FromString(value).data
    except DecodeError:
        return []
