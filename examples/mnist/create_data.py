"""Convert MNIST-format IDX files into kvfile shards of RecordProto, like SINGA's create_data.

    python examples/mnist/create_data.py <images-idx3> <labels-idx1> <out.bin>
    python examples/mnist/create_data.py [--dataset-dir DIR] [--out-dir DIR]

The first form converts one pair. The second writes train_data.bin (train-*) and
test_data.bin (t10k-*) into --out-dir (default: beside this script) from --dataset-dir
(default: Debian's Fashion-MNIST), skipping outputs that are already complete.
Record i is keyed "%08d" % i with RecordProto{shape: [rows, cols], label, pixel}: the same
bytes SINGA's tool writes. IDX files may be gzip or raw.
"""
import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
# Run from a checkout: use the singa package beside this script, not another installed one.
if os.path.isfile(os.path.join(_ROOT, "singa", "__init__.py")) and _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from singa.errors import DataError, SingaError, run_command  # noqa: E402
from singa.io.idx import read_idx  # noqa: E402
from singa.io.kvfile import KVFile  # noqa: E402
from singa.proto import common_pb2  # noqa: E402

DATASET_DIR = "/usr/share/datasets/fashion-mnist"
SPLITS = (("train_data.bin", "train"), ("test_data.bin", "t10k"))


def create_data(images_path, labels_path, out_path, progress=sys.stderr):
    """Write the kvfile `out_path` from an images and a labels IDX file; return the record count.

    The shard is written under a temporary name and renamed when complete.
    """
    images, labels = _read_pair(images_path, labels_path)
    out_dir = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(out_dir):
        raise DataError(f"{out_path}: directory {out_dir} does not exist")
    n, rows, cols = images.shape
    name = os.path.basename(out_path)
    tmp = f"{out_path}.tmp{os.getpid()}"
    rec = common_pb2.RecordProto(shape=[rows, cols])
    try:
        with KVFile(tmp, "create") as f:
            for i in range(n):
                rec.label = int(labels[i])
                rec.pixel = images[i].tobytes()
                f.insert(b"%08d" % i, rec.SerializeToString())
                if progress and (i + 1) % 1000 == 0:
                    _bar(progress, name, i + 1, n)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out_path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    if progress:
        _bar(progress, name, n, n, final=True)
    return n


def is_complete(out_path, labels_path):
    """True when `out_path` holds one complete tuple per label of `labels_path`."""
    if not os.path.isfile(out_path):
        return False
    with KVFile(out_path, "read") as f:
        return f.count() == len(read_idx(labels_path))


def find_idx(dataset_dir, name):
    """`dataset_dir/name`, raw or with .gz."""
    for path in (os.path.join(dataset_dir, name), os.path.join(dataset_dir, name + ".gz")):
        if os.path.isfile(path):
            return path
    raise DataError(f"{dataset_dir}: no {name} or {name}.gz")


def prepare(dataset_dir, out_dir, progress=sys.stderr):
    """Write train_data.bin and test_data.bin into `out_dir`, skipping complete ones."""
    for out_name, prefix in SPLITS:
        images = find_idx(dataset_dir, f"{prefix}-images-idx3-ubyte")
        labels = find_idx(dataset_dir, f"{prefix}-labels-idx1-ubyte")
        out = os.path.join(out_dir, out_name)
        if is_complete(out, labels):
            if progress:
                print(f"{out_name}: complete, skipped", file=progress)
            continue
        create_data(images, labels, out, progress)


def main(argv=None):
    parser = _Parser(prog="create_data.py", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", metavar="IDX/OUT",
                        help="<images-idx3> <labels-idx1> <out.bin>")
    parser.add_argument("--dataset-dir", help=f"IDX files (default {DATASET_DIR})")
    parser.add_argument("--out-dir", help="where train/test_data.bin go (default: beside "
                                          "this script)")

    def work():
        args = parser.parse_args(argv)
        if args.files:
            if len(args.files) != 3 or args.dataset_dir or args.out_dir:
                raise SingaError("usage: create_data.py <images-idx3> <labels-idx1> <out.bin>"
                                 " | [--dataset-dir DIR] [--out-dir DIR]")
            create_data(*args.files)
        else:
            prepare(args.dataset_dir or DATASET_DIR, args.out_dir or _HERE)
    return run_command(work)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, not argparse's usage block.
        raise SingaError(f"create_data.py: {message}")


def _read_pair(images_path, labels_path):
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3:
        raise DataError(f"{images_path}: a labels file (magic 2049) where images were expected")
    if labels.ndim != 1:
        raise DataError(f"{labels_path}: an images file (magic 2051) where labels were expected")
    if len(images) != len(labels):
        raise DataError(f"{images_path} has {len(images)} images but {labels_path} has "
                        f"{len(labels)} labels")
    return images, labels


def _bar(stream, name, done, total, final=False, width=30):
    """`name [#####.....] done/total`, redrawn in place on a terminal; the final line stays."""
    if not (final or stream.isatty()):
        return
    fill = width * done // max(total, 1)
    stream.write(f"\r{name} [{'#' * fill}{'.' * (width - fill)}] {done}/{total}"
                 + ("\n" if final else ""))
    stream.flush()


if __name__ == "__main__":
    sys.exit(main())
