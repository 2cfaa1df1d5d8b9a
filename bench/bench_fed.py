"""Bench: images per second of a Caffe LMDB of JPEG Datums through the input layers, decoded
side by side and read ahead (ours) against one image at a time in the training thread (issue
47: "a fed GPU").

    python bench/bench_fed.py [--images 512] [--size 256] [--batch 64] [--crop 224]
                              [--step-ms 0,100] [--batches 16] [--rounds 3]

A temporary LMDB of `--images` JPEG Datums (quality 90, `--size` square, colour: smooth
gradients with noise, as photos compress), read by kRecordInput (backend lmdb) at `--batch`
and cropped to `--crop` and mirrored by kImagePreprocess (Caffe's transforms), `--batches`
batches a round. Ours (processes): the store decodes a batch's images in its decoding
processes (`images.decode_many`, `singa.io.decoders`) and the input layer reads the next batch
in its own thread while the net computes. Threads: the same with a decoding thread per CPU,
an image a task (decode_many before the processes). One at a time: the decoding made serial
in the calling thread and no read-ahead (as before issue 47). Each `--step-ms` adds a training
step of that many ms that holds no GIL (a GPU's step as the host sees it: a wait), so the
figure is what the input lets a GPU train at. Rounds alternate the sides; medians, images/s.

Then a GPU job's training thread on one batch (`training_thread_ms`): its work with
ImagePreprocess on the host (the CPU's kernels; SINGA_KERNELS=numpy for numpy's) against
on the GPU, and the images/s that work alone allows; and its reading thread's
(`reading_thread_ms`): a batch read and decoded into one array by threads against by
processes. The bench measures; it exits 0 whatever the figures.
"""
import argparse
import functools
import io
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import singa  # noqa: F401  (first: it picks OpenBLAS's kernels before numpy loads it)
import numpy as np

from singa.io import images, lmdbstore
from singa.io.records import uniform_pixels
from singa.io.store import read_columns
from singa.layers.base import create_layer
from singa.proto import caffe_pb2, job_pb2

FLAG = job_pb2.kTrain | job_pb2.kForward


def photos(n, size):
    """`n` JPEGs (quality 90) of size × size colour pixels: smooth gradients with noise, as
    photos compress."""
    from PIL import Image
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 200, size, dtype=np.float32)
    for _ in range(n):
        base = ramp[:, None, None] * rng.random(3) + ramp[None, :, None] * rng.random(3)
        pixels = np.clip(base + rng.normal(0, 12, (size, size, 3)), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=90)
        yield buf.getvalue()


def write_lmdb(path, n, size):
    import lmdb
    with lmdb.open(path, map_size=1 << 32) as env, env.begin(write=True) as txn:
        for i, jpeg in enumerate(photos(n, size)):
            datum = caffe_pb2.Datum(channels=3, height=size, width=size, label=i % 10,
                                    encoded=True, data=jpeg)
            txn.put(b"%08d" % i, datum.SerializeToString())


def layers(path, batch, crop, mean=None):
    """The data and preprocess layers, set up."""
    data_conf = job_pb2.LayerProto()
    data_conf.name, data_conf.type = "data", job_pb2.kRecordInput
    data_conf.store_conf.backend, data_conf.store_conf.path = "lmdb", path
    data_conf.store_conf.batchsize.append(batch)
    if mean is not None:
        data_conf.store_conf.mean_value = mean
    data = create_layer(data_conf)
    data.rng = np.random.default_rng(0)
    data.setup([])
    pre_conf = job_pb2.LayerProto()
    pre_conf.name, pre_conf.type = "pre", job_pb2.kImagePreprocess
    pre_conf.rgbimage_conf.cropsize, pre_conf.rgbimage_conf.mirror = crop, True
    pre = create_layer(pre_conf)
    pre.rng = np.random.default_rng(1)
    pre.setup([data])
    return data, pre


def serial(items):
    return stacked([images.decode_image(*args) for args in items])


def threaded(items):
    """A thread per CPU, one image a task (decode_many before the decoding processes)."""
    return stacked(list(_threads().map(lambda args: images.decode_image(*args), items)))


def stacked(pixels):
    """decode_many's result from a list of images: stacked into one array (as batch_values
    did) where they have one shape."""
    return np.stack(pixels) if pixels and len({x.shape for x in pixels}) == 1 else pixels


@functools.cache
def _threads():
    return ThreadPoolExecutor(len(os.sched_getaffinity(0)), thread_name_prefix="decode")


ENGINES = {"one at a time": serial, "threads": threaded, "processes": images.decode_many}


def engine(name):
    """Decode batches as `name` does (ENGINES), in the store's calls and in batch_values'."""
    images.decode_many = lmdbstore.decode_many = ENGINES[name]


def images_per_s(path, args, step_ms, name):
    engine(name)
    try:
        data, pre = layers(path, args.batch, args.crop)
        data.read_ahead = name != "one at a time"
        data.compute_feature(FLAG, [])      # opened, first batch read
        t = time.perf_counter()
        for _ in range(args.batches):
            data.compute_feature(FLAG, [])
            pre.compute_feature(FLAG, [data])
            if step_ms:
                time.sleep(step_ms / 1e3)
        seconds = time.perf_counter() - t
        data.close()
    finally:
        engine("processes")
    return args.batches * args.batch / seconds


def training_thread_ms(path, args):
    """{side: median ms} of a batch's work in the training thread of a GPU job, from the
    batch as the store gives it (decoded) to what goes to the device: ImagePreprocess on the
    host (as before issue 47's second slice: the records parsed to floats, (x − mean) / std,
    crop, mirror and scale, the crops copied into the upload's pinned buffer) against on the
    GPU (now: the pixel bytes copied into the pinned buffer, the offsets drawn; the records
    are parsed to bytes in the reading thread, `uniform_pixels`)."""
    data, pre = layers(path, args.batch, args.crop, mean=117)
    data.read_ahead = False
    keys, values = read_columns(data.store or data._open(), args.batch, path, "lmdb")
    x = data.data.reshape(args.batch, data.dim)
    labels = np.empty(args.batch, np.int32)
    pixels = uniform_pixels(values, data.dim, labels)
    pinned_floats, pinned_bytes = np.empty_like(pre.data), np.empty_like(pixels)
    at = np.empty((3, args.batch), np.int32)

    def on_host():
        data.parse(keys, values, FLAG, x)
        np.subtract(x, data.mean, out=x)
        pre.transform(FLAG, data.data)
        np.copyto(pinned_floats, pre.data)

    def on_gpu():
        np.copyto(pinned_bytes, pixels)
        at[0] = pre.rng.integers(0, args.size - args.crop + 1, args.batch)
        at[1] = pre.rng.integers(0, args.size - args.crop + 1, args.batch)
        at[2] = pre.rng.integers(0, 2, args.batch)

    times = {"ImagePreprocess on the host": on_host, "on the GPU": on_gpu}
    ms = {side: [] for side in times}
    for _ in range(args.rounds * 5):
        for side, work in times.items():
            t = time.perf_counter()
            work()
            ms[side].append((time.perf_counter() - t) * 1e3)
    data.close()
    return {side: statistics.median(v) for side, v in ms.items()}


def reading_thread_ms(path, args):
    """{engine: median ms} of the reading thread's work for a batch of a GPU job: the records
    read, decoded side by side into one array (`LMDBStore.read_samples`) and made the pixel
    bytes the layer uploads, by decoding threads (before) and processes (now)."""
    labels = np.empty(args.batch, np.int32)
    dim = 3 * args.size * args.size
    ms = {"threads (before)": [], "processes (now)": []}
    with lmdbstore.LMDBStore(path) as store:
        for _ in range(args.rounds * 5):
            for side, name in zip(ms, ("threads", "processes")):
                engine(name)
                if store.tell() + args.batch > store.count():
                    store.seek(0)
                t = time.perf_counter()
                uniform_pixels(store.read_samples(args.batch)[1], dim, labels)
                ms[side].append((time.perf_counter() - t) * 1e3)
    engine("processes")
    return {side: statistics.median(v) for side, v in ms.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--step-ms", default="0,100", help="simulated step times, comma-separated")
    ap.add_argument("--batches", type=int, default=16, help="batches a round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="singa-bench-fed-") as tmp:
        path = os.path.join(tmp, "jpeg_lmdb")
        write_lmdb(path, args.images, args.size)
        print(f"{args.images} JPEG Datums {args.size}x{args.size}, batch {args.batch}, crop "
              f"{args.crop} + mirror; {len(os.sched_getaffinity(0))} CPUs; images/s, median of "
              f"{args.rounds} rounds of {args.batches} batches")
        print(f"{'step ms':>8s} {'one at a time':>14s} {'threads':>8s} {'processes':>10s} "
              f"{'ours / one':>11s} {'step alone':>11s}")
        for step_ms in (float(s) for s in args.step_ms.split(",")):
            sides = {name: [] for name in ENGINES}
            for _ in range(args.rounds):
                for name in ENGINES:
                    sides[name].append(images_per_s(path, args, step_ms, name))
            one, threads, ours = (statistics.median(sides[name]) for name in ENGINES)
            alone = f"{args.batch / step_ms * 1e3:11.0f}" if step_ms else f"{'-':>11s}"
            print(f"{step_ms:8.0f} {one:14.0f} {threads:8.0f} {ours:10.0f} {ours / one:11.2f} "
                  f"{alone}")
        print(f"\nA GPU job's training thread, a batch from the store's to the device's "
              f"(mean_value 117), median ms of {args.rounds * 5}:")
        for side, ms in training_thread_ms(path, args).items():
            print(f"{side:>28s} {ms:8.2f} ms  {args.batch / ms * 1e3:8.0f} images/s at most")
        print(f"\nIts reading thread, a batch read, decoded ({len(os.sched_getaffinity(0))} "
              f"threads or processes) and made the bytes it uploads, median ms of "
              f"{args.rounds * 5}:")
        for side, ms in reading_thread_ms(path, args).items():
            print(f"{side:>28s} {ms:8.2f} ms  {args.batch / ms * 1e3:8.0f} images/s")


if __name__ == "__main__":
    main()
