"""Bench: how long a batch's JPEG decoding holds the GIL of the process that asks for it, per
image, with decoding threads (one per CPU, an image a task: `images.decode_many` before
issue 47's decoding processes) and with the decoding processes (`singa.io.decoders`, now).
Where decoding holds the GIL for g ms an image, a process decodes at most 1000 / g images a
second whatever its cores: the ceiling this prints.

    python bench/bench_decode_gil.py [--batch 64] [--size 256] [--seconds 10] [--rate 200]

Needs py-spy (`pip install py-spy`, a bench's tool, not a dependency): each engine runs in a
child process under `py-spy record --gil` (only samples of a thread holding the GIL), which
decodes the same batch of `--batch` JPEGs (bench_fed's photos, `--size` square) again and
again for `--seconds`; the samples whose stack is in that loop or in a decoding thread, over
the images decoded, are its GIL time an image; beside it the CPU time of that process an image
(with threads all of the decoding, with processes what the asking takes). Sampling at
`--rate` Hz takes some CPU itself: on a small machine its images/s are a little below
bench_fed's. The bench measures; it exits 0 whatever the figures (2 without py-spy).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import bench_fed


def decode_loop(engine, batch, size, seconds, out):
    """Decode `batch` JPEGs with `engine` for `seconds` (after two batches' warm-up); the count
    of images decoded and the CPU seconds this process took for them into the file `out`."""
    raws = [(jpeg, f"image {i}") for i, jpeg in enumerate(bench_fed.photos(batch, size))]
    decode = bench_fed.ENGINES[engine]
    decode(raws)
    decode(raws)
    cpu = time.process_time()
    n = timed(decode, raws, seconds)
    with open(out, "w") as f:
        f.write(f"{n} {time.process_time() - cpu}")


def timed(decode, raws, seconds):
    """The images `decode` decoded in `seconds` (the stacks counted)."""
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        decode(raws)
        n += len(raws)
    return n


# the stacks of the timed loop: its own, and the decoding threads' (which decode nothing else)
COUNTED = ("timed (", "concurrent/futures/thread.py")


def gil_ms(engine, args, spy, tmp):
    """(ms of GIL an image in the decoding loop, images/s, CPU ms an image of the process
    asking) of `engine`."""
    raw, count = os.path.join(tmp, f"{engine}.txt"), os.path.join(tmp, f"{engine}.n")
    subprocess.run([spy, "record", "--gil", "--rate", str(args.rate), "--format", "raw",
                    "--output", raw, "--", sys.executable, __file__, "--loop", engine,
                    "--batch", str(args.batch), "--size", str(args.size), "--seconds",
                    str(args.seconds), "--count", count], check=True, capture_output=True)
    samples = 0
    with open(raw) as f:
        for line in f:
            stack, n = line.rsplit(" ", 1)
            samples += int(n) if any(mark in stack for mark in COUNTED) else 0
    with open(count) as f:
        images, cpu = f.read().split()
    images = int(images)
    return samples * 1e3 / args.rate / images, images / args.seconds, float(cpu) * 1e3 / images


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rate", type=int, default=200, help="py-spy's samples a second")
    ap.add_argument("--loop", help=argparse.SUPPRESS)
    ap.add_argument("--count", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.loop:
        return decode_loop(args.loop, args.batch, args.size, args.seconds, args.count)
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if spy is None:
        print("bench_decode_gil.py needs py-spy: pip install py-spy", file=sys.stderr)
        return 2
    print(f"a batch of {args.batch} JPEGs {args.size}x{args.size} decoded for {args.seconds:g} s,"
          f" {len(os.sched_getaffinity(0))} CPUs, py-spy --gil at {args.rate} Hz")
    print(f"{'engine':>10s} {'images/s':>9s} {'GIL ms an image':>16s} {'images/s at most':>17s} "
          f"{'CPU ms an image':>16s}")
    with tempfile.TemporaryDirectory(prefix="singa-bench-gil-") as tmp:
        for engine in ("threads", "processes"):
            ms, rate, cpu = gil_ms(engine, args, spy, tmp)
            print(f"{engine:>10s} {rate:9.0f} {ms:16.3f} {1e3 / ms:17.0f} {cpu:16.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
