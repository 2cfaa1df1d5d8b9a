"""Bench: bin/singa-import.sh caffe on a VGG-16-shaped `.caffemodel` (138 M float values,
~553 MB): peak RSS of the import per file size, and its seconds.

    python bench/bench_caffe_import.py [--dir DIR] [--keep] [--scale S]

A VGG-16 deploy prototxt (13 convolutions, 3 InnerProduct layers, in-place ReLU and Dropout)
and a `.caffemodel` of its shapes (random values, V2 `layer` entries with `shape` blobs) are
written to a temporary directory under `--dir` (default: the system's temporary directory), in
chunks so that this process stays small. The import runs as a child process (the command a
user runs); its peak RSS (`wait4`'s ru_maxrss) and wall time are printed beside the file
size, and the checkpoint written is checked against the model's values. Target: peak RSS well
under 2x the file (SINGA 0.3 refused files over 512 MiB). `--scale` divides every fc6/fc7 width
for a quick try. Exits 0 whatever the figures.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from singa.checkpoint import CheckpointReader  # noqa: E402
from singa.io.protowire import prefix  # noqa: E402
from singa.proto import caffe_pb2  # noqa: E402

CONVS = [("conv1_1", 3, 64), ("conv1_2", 64, 64), ("pool1",),
         ("conv2_1", 64, 128), ("conv2_2", 128, 128), ("pool2",),
         ("conv3_1", 128, 256), ("conv3_2", 256, 256), ("conv3_3", 256, 256), ("pool3",),
         ("conv4_1", 256, 512), ("conv4_2", 512, 512), ("conv4_3", 512, 512), ("pool4",),
         ("conv5_1", 512, 512), ("conv5_2", 512, 512), ("conv5_3", 512, 512), ("pool5",)]


def vgg16(fc):
    """[(name, type, bottom, top, {param}, [blob shapes])] of VGG-16's deploy net."""
    layers, blob = [], "data"
    for entry in CONVS:
        if len(entry) == 1:
            layers.append((entry[0], "Pooling", blob, entry[0], "pooling_param { pool: MAX "
                           "kernel_size: 2 stride: 2 }", []))
            blob = entry[0]
            continue
        name, c, f = entry
        layers.append((name, "Convolution", blob, name, f"convolution_param {{ num_output: {f} "
                       f"pad: 1 kernel_size: 3 }}", [(f, c, 3, 3), (f,)]))
        layers.append((f"relu{name[4:]}", "ReLU", name, name, "", []))
        blob = name
    k = 512 * 7 * 7
    for i, n in ((6, fc), (7, fc), (8, 1000)):
        name = f"fc{i}"
        layers.append((name, "InnerProduct", blob, name, f"inner_product_param {{ num_output: "
                       f"{n} }}", [(n, k), (n,)]))
        if i < 8:
            layers.append((f"relu{i}", "ReLU", name, name, "", []))
            layers.append((f"drop{i}", "Dropout", name, name, "dropout_param { dropout_ratio: "
                           "0.5 }", []))
        blob, k = name, n
    layers.append(("prob", "Softmax", blob, "prob", "", []))
    return layers


def write_deploy(path, layers):
    with open(path, "w") as f:
        f.write('name: "VGG_ILSVRC_16_layers"\nlayer { name: "data" type: "Input" top: "data" '
                'input_param { shape { dim: 1 dim: 3 dim: 224 dim: 224 } } }\n')
        for name, kind, bottom, top, param, _ in layers:
            f.write(f'layer {{ name: "{name}" type: "{kind}" bottom: "{bottom}" top: "{top}" '
                    f'{param} }}\n')


def write_caffemodel(path, layers, seed=0, chunk=1 << 22):
    """The weights as Caffe writes them (NetParameter.layer = 100, LayerParameter.blobs = 7,
    BlobProto.shape = 7, packed data = 5), values N(0, 0.01) float32 written chunk by chunk.
    Returns the first and last values of each blob, for checking."""
    rng = np.random.default_rng(seed)
    ends = {}
    with open(path, "wb") as f:
        f.write(caffe_pb2.NetParameter(name="VGG_ILSVRC_16_layers").SerializeToString())
        for name, kind, bottom, top, _, shapes in layers:
            if not shapes:
                continue
            head = caffe_pb2.LayerParameter(name=name, type=kind, bottom=[bottom],
                                            top=[top]).SerializeToString()
            blobs = []
            for shape in shapes:
                n = int(np.prod(shape))
                shape_msg = caffe_pb2.BlobShape(dim=shape).SerializeToString()
                pre = prefix(7, len(shape_msg)) + shape_msg + prefix(5, 4 * n)
                blobs.append((pre, n))
            body = len(head) + sum(len(prefix(7, len(pre) + 4 * n)) + len(pre) + 4 * n
                                   for pre, n in blobs)
            f.write(prefix(100, body) + head)
            for i, (pre, n) in enumerate(blobs):
                f.write(prefix(7, len(pre) + 4 * n) + pre)
                first = last = None
                for start in range(0, n, chunk):
                    a = rng.standard_normal(min(chunk, n - start), np.float32)
                    a *= np.float32(0.01)
                    first = a[0] if first is None else first
                    last = a[-1]
                    f.write(a.tobytes())
                ends[(name, i)] = (first, last)
    return ends


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--scale", type=int, default=1, help="divide fc6/fc7 widths (quick try)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-caffe-import-", dir=args.dir)
    try:
        layers = vgg16(4096 // args.scale)
        deploy, model = os.path.join(tmp, "deploy.prototxt"), os.path.join(tmp, "vgg16.caffemodel")
        write_deploy(deploy, layers)
        t0 = time.perf_counter()
        ends = write_caffemodel(model, layers)
        size = os.path.getsize(model)
        values = sum(int(np.prod(s)) for *_, shapes in layers for s in shapes)
        print(f"generated {model}: {values / 1e6:.1f} M values, {size / 1e6:.1f} MB in "
              f"{time.perf_counter() - t0:.1f} s")
        subprocess.run(["sync"], check=False)
        out = os.path.join(tmp, "imported")
        t0 = time.perf_counter()
        proc = subprocess.Popen([os.path.join(ROOT, "bin", "singa-import.sh"), "caffe", deploy,
                                 model, "-o", out], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        err = proc.stderr.read().decode()
        if os.waitstatus_to_exitcode(status) != 0:
            print(f"import failed: {err}")
            return 0
        rss = usage.ru_maxrss * 1024
        ckpt = os.path.join(out, "checkpoint", "step0-worker0.bin")
        print(f"fs of {tmp}: {_fs(tmp)}")
        print(f"{'file':>10} {'values':>10} {'import s':>9} {'peak RSS':>10} {'RSS/file':>9}")
        print(f"{size / 1e6:>8.1f}MB {values / 1e6:>9.1f}M {seconds:>9.2f} {rss / 1e6:>8.1f}MB "
              f"{rss / size:>9.2f}   (target: well under 2.00)")
        r = CheckpointReader(ckpt)
        bad = [key for key, (first, last) in ends.items()
               if (lambda v: v[0] != first or v[-1] != last)(
                   r.view(f"0#{key[0]}_{('weight', 'bias')[key[1]]}").ravel())]
        print(f"checkpoint {os.path.getsize(ckpt) / 1e6:.1f} MB, verified {r.verified}, "
              f"{len(r.names)} params, values {'differ: ' + str(bad) if bad else 'as in the model'}")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _fs(path):
    try:
        out = subprocess.run(["df", "-T", path], capture_output=True, text=True).stdout
        return out.splitlines()[-1].split()[1]
    except (OSError, IndexError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
