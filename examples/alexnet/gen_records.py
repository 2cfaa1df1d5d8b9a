"""Write a small ImageNet-style record store from generated images (ImageNet is not available).

    python examples/alexnet/gen_records.py [--out-dir DIR] [--train 256] [--val 100] [--seed 0]

The layout is that of SINGA's examples/alexnet/im2rec.cc: a kvfile of RecordProto{shape: [3,
256, 256], label, pixel: 196,608 bytes, C-major}, keys "%08d" from 00000000, and image_mean.bin,
a kvfile of one tuple "mean": RecordProto{shape, data: the mean training image}. Files:
train_record.bin, val_record.bin and image_mean.bin, the names alexnet/job.conf reads from
/data/dataset/imagenet/. The images are NOT photographs: image i of label k (k < 1000) is
noise around a colour of k's own, so a net can learn something from them.
"""
import argparse
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
# Run from a checkout: use the singa package beside this script, not another installed one.
if os.path.isfile(os.path.join(_ROOT, "singa", "__init__.py")) and _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from singa.errors import DataError, SingaError, run_command  # noqa: E402
from singa.io.kvfile import KVFile  # noqa: E402
from singa.proto import common_pb2  # noqa: E402

SHAPE = (3, 256, 256)
CLASSES = 1000


def images(rng, colours, n):
    """n (label, uint8 image of SHAPE) pairs: noise in [−32, 32) around the label's colour."""
    for label in rng.integers(0, CLASSES, n).tolist():
        noise = rng.integers(-32, 32, SHAPE)
        yield label, np.clip(colours[label][:, None, None] + noise, 0, 255).astype(np.uint8)


def write_store(path, pairs):
    """The kvfile `path` of im2rec's records; returns the per-position pixel sums and count."""
    rec = common_pb2.RecordProto(shape=SHAPE)
    total = np.zeros(SHAPE, np.int64)
    count = 0
    with KVFile(path, "create") as f:
        for label, image in pairs:
            rec.label = label
            rec.pixel = image.tobytes()
            f.insert(b"%08d" % count, rec.SerializeToString())
            total += image
            count += 1
    return total, count


def generate(out_dir, train=256, val=100, seed=0):
    """Write train_record.bin, val_record.bin and image_mean.bin into `out_dir`."""
    if train <= 0 or val <= 0:
        raise SingaError(f"gen_records.py: --train and --val must be positive, got {train}, {val}")
    if not os.path.isdir(out_dir):
        raise DataError(f"{out_dir}: output folder does not exist")
    rng = np.random.default_rng(seed)
    colours = rng.integers(32, 224, (CLASSES, 3))
    total, count = write_store(os.path.join(out_dir, "train_record.bin"), images(rng, colours, train))
    write_store(os.path.join(out_dir, "val_record.bin"), images(rng, colours, val))
    mean = common_pb2.RecordProto(shape=SHAPE, data=(np.float32(total) / np.float32(count)).ravel())
    with KVFile(os.path.join(out_dir, "image_mean.bin"), "create") as f:
        f.insert(b"mean", mean.SerializeToString())


def main(argv=None):
    parser = argparse.ArgumentParser(prog="gen_records.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default=_HERE, help="output folder (default: beside this script)")
    parser.add_argument("--train", type=int, default=256, help="training records (default 256)")
    parser.add_argument("--val", type=int, default=100, help="validation records (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    status = run_command(generate, args.out_dir, args.train, args.val, args.seed)
    if status:
        return status
    print(f"{args.out_dir}: train_record.bin ({args.train}), val_record.bin ({args.val}) and "
          f"image_mean.bin of generated images (not ImageNet)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
