"""Convert CIFAR-10's binary batches into kvfile shards of RecordProto, like SINGA's create_data.

    python examples/cifar10/create_data.py [<input_folder> [<output_folder>]]

<input_folder> (default: cifar-10-batches-bin beside this script) holds data_batch_1.bin ..
data_batch_5.bin and test_batch.bin, each a run of records of 1 label byte and 3072 pixel
bytes (the R, G and B planes of a 32x32 image). <output_folder> (default: beside this script)
receives the files SINGA's examples/cifar10/create_data.cc writes, byte for byte:
  train_data.bin  the five batches, RecordProto{shape: [3, 32, 32], label, pixel}, keys "%05d"
                  counting from 00000
  image_mean.bin  a kvfile of one tuple, key "mean": RecordProto{shape: [3, 32, 32], data:
                  the mean of every training pixel position}
  test_data.bin   test_batch.bin's records, keys "%05d"
SINGA reads exactly 10,000 records per file; here a file may hold any whole number of them.
Outputs newer than every input are kept as they are.
"""
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
# Run from a checkout: use the singa package beside this script, not another installed one.
if os.path.isfile(os.path.join(_ROOT, "singa", "__init__.py")) and _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from singa.errors import DataError, run_command  # noqa: E402
from singa.io.kvfile import KVFile  # noqa: E402
from singa.proto import common_pb2  # noqa: E402

SHAPE = (3, 32, 32)
IMAGE_BYTES = 3 * 32 * 32
TRAIN_BATCHES = [f"data_batch_{i}.bin" for i in range(1, 6)]
TEST_BATCH = "test_batch.bin"
OUTPUTS = ("train_data.bin", "image_mean.bin", "test_data.bin")


def read_batch(path):
    """(labels int8 (N,), pixels uint8 (N, 3072)) of one CIFAR-10 binary batch file."""
    try:
        raw = np.fromfile(path, np.uint8)
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror}") from None
    if raw.size == 0 or raw.size % (IMAGE_BYTES + 1):
        raise DataError(f"{path}: {raw.size} bytes is not a whole number of CIFAR-10 records "
                        f"({IMAGE_BYTES + 1} bytes each)")
    records = raw.reshape(-1, IMAGE_BYTES + 1)
    # SINGA reads the label as a (signed) char
    return records[:, 0].view(np.int8), records[:, 1:]


def write_records(out_path, batches):
    """Write the kvfile `out_path` of the records of `batches` (pairs from read_batch), keys
    "%05d" from 0; return the per-position pixel sums (int64) and the record count."""
    rec = common_pb2.RecordProto(shape=SHAPE)
    total = np.zeros(IMAGE_BYTES, np.int64)
    count = 0
    with _replacing(out_path) as tmp, KVFile(tmp, "create") as f:
        for labels, pixels in batches:
            for label, image in zip(labels.tolist(), pixels):
                rec.label = label
                rec.pixel = image.tobytes()
                f.insert(b"%05d" % count, rec.SerializeToString())
                count += 1
            total += pixels.sum(axis=0, dtype=np.int64)
    return total, count


def write_mean(out_path, total, count):
    """image_mean.bin: one tuple "mean" -> RecordProto{shape, data = total / count} (float32)."""
    mean = np.float32(total) / np.float32(count)    # SINGA: float sums, divided by the count
    rec = common_pb2.RecordProto(shape=SHAPE, data=mean)
    with _replacing(out_path) as tmp, KVFile(tmp, "create") as f:
        f.insert(b"mean", rec.SerializeToString())


def create_data(input_folder, output_folder, log=None):
    """Write train_data.bin, image_mean.bin and test_data.bin (see the module docstring);
    progress lines go to `log` (default stderr)."""
    log = log or sys.stderr
    inputs = [os.path.join(input_folder, name) for name in TRAIN_BATCHES + [TEST_BATCH]]
    for path in inputs:
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such CIFAR-10 batch file")
    if not os.path.isdir(output_folder):
        raise DataError(f"{output_folder}: output folder does not exist")
    outputs = [os.path.join(output_folder, name) for name in OUTPUTS]
    if _up_to_date(outputs, inputs):
        print(f"{', '.join(OUTPUTS)}: newer than {input_folder}, kept", file=log)
        return
    total, count = write_records(outputs[0], (read_batch(p) for p in inputs[:-1]))
    print(f"train_data.bin: {count} records", file=log)
    write_mean(outputs[1], total, count)
    print("image_mean.bin: mean of the training images", file=log)
    _, n = write_records(outputs[2], [read_batch(inputs[-1])])
    print(f"test_data.bin: {n} records", file=log)


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 2 or any(a.startswith("-") for a in args):
        print("usage: create_data.py [<input_folder> [<output_folder>]]", file=sys.stderr)
        return 2
    return run_command(create_data, args[0] if args else os.path.join(_HERE, "cifar-10-batches-bin"),
                       args[1] if len(args) > 1 else _HERE)


class _replacing:
    """Context: a temporary name beside `path`, renamed to `path` only when the block succeeds."""

    def __init__(self, path):
        self.path = path
        self.tmp = f"{path}.tmp{os.getpid()}"

    def __enter__(self):
        return self.tmp

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            with open(self.tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(self.tmp, self.path)
        elif os.path.exists(self.tmp):
            os.remove(self.tmp)


def _up_to_date(outputs, inputs):
    if not all(os.path.isfile(p) for p in outputs):
        return False
    return min(os.path.getmtime(p) for p in outputs) > max(os.path.getmtime(p) for p in inputs)


if __name__ == "__main__":
    sys.exit(main())
