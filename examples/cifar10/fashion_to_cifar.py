"""Pack Fashion-MNIST (IDX) into CIFAR-10's binary batch layout, for machines without CIFAR-10.

    python examples/cifar10/fashion_to_cifar.py [--dataset-dir DIR] [--out-dir DIR]

This is NOT CIFAR-10. Each 28x28 grey Fashion-MNIST image is padded with 2 black pixels on
every side to 32x32 and the same plane is written as R, G and B: a record is 1 label byte and
3072 pixel bytes, as in CIFAR-10. The first 50,000 training images fill data_batch_1.bin ..
data_batch_5.bin (10,000 each), the 10,000 test images test_batch.bin, and batches.meta.txt
names the classes. --dataset-dir defaults to Debian's dataset-fashion-mnist; --out-dir to
fashion-mnist-as-cifar-bin beside this script. Then run create_data.py on --out-dir.
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

from singa.errors import DataError, run_command  # noqa: E402
from singa.io.idx import read_idx  # noqa: E402

DATASET_DIR = "/usr/share/datasets/fashion-mnist"
OUT_DIR = os.path.join(_HERE, "fashion-mnist-as-cifar-bin")
BATCH = 10000
TRAIN_BATCHES = 5
PAD = 2
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]


def cifar_records(images, labels):
    """(N, 3073) uint8: label, then the image padded to 32x32 and repeated as R, G, B planes."""
    n, rows, cols = images.shape
    if (rows + 2 * PAD, cols + 2 * PAD) != (32, 32):
        raise DataError(f"images of {rows}x{cols} pixels do not pad to CIFAR-10's 32x32")
    records = np.zeros((n, 1 + 3 * 32 * 32), np.uint8)
    records[:, 0] = labels
    planes = records[:, 1:].reshape(n, 3, 32, 32)
    planes[:, :, PAD:PAD + rows, PAD:PAD + cols] = images[:, None]
    return records


def pack(dataset_dir, out_dir):
    """Write data_batch_1..5.bin, test_batch.bin and batches.meta.txt into `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    for prefix, names in (("train", [f"data_batch_{i + 1}.bin" for i in range(TRAIN_BATCHES)]),
                          ("t10k", ["test_batch.bin"])):
        images = read_idx(_find(dataset_dir, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_find(dataset_dir, f"{prefix}-labels-idx1-ubyte"))
        if len(images) < BATCH * len(names) or len(labels) != len(images):
            raise DataError(f"{dataset_dir}: {prefix} has {len(images)} images and "
                            f"{len(labels)} labels; {BATCH * len(names)} of each are needed")
        for i, name in enumerate(names):
            part = slice(i * BATCH, (i + 1) * BATCH)
            path = os.path.join(out_dir, name)
            cifar_records(images[part], labels[part]).tofile(path + ".tmp")
            os.replace(path + ".tmp", path)     # a file that exists is whole
    with open(os.path.join(out_dir, "batches.meta.txt"), "w") as f:
        f.write("\n".join(CLASSES) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="fashion_to_cifar.py", description=__doc__.split("\n")[0])
    parser.add_argument("--dataset-dir", default=DATASET_DIR,
                        help=f"Fashion-MNIST IDX files, raw or .gz (default {DATASET_DIR})")
    parser.add_argument("--out-dir", default=OUT_DIR, help=f"output folder (default {OUT_DIR})")
    args = parser.parse_args(argv)
    status = run_command(pack, args.dataset_dir, args.out_dir)
    if status:
        return status
    print(f"{args.out_dir}: Fashion-MNIST packed into CIFAR-10's layout (padded to 32x32, grey "
          f"replicated to R, G, B); not CIFAR-10", file=sys.stderr)
    return 0


def _find(dataset_dir, name):
    for path in (os.path.join(dataset_dir, name), os.path.join(dataset_dir, name + ".gz")):
        if os.path.isfile(path):
            return path
    raise DataError(f"{dataset_dir}: no {name} or {name}.gz")


if __name__ == "__main__":
    sys.exit(main())
