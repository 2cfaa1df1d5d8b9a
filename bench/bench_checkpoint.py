"""Bench: checkpoint costs of SINGA's MNIST MLP (~48 MB of params), against plain baselines.

    python bench/bench_checkpoint.py [--rounds 10] [--train-rounds 2] [--train-steps 200]
                                     [--start-rounds 5] [--dir DIR] [--skip a,b,c]

(a) write: `singa.checkpoint.write_file` of the 12 params (random float32, the shapes of the
    six InnerProduct layers) vs writing the same bytes with numpy to a temporary name, then
    flush, fsync and rename. Target ours / numpy <= 1.3.
(b) training overhead of `checkpoint_freq: 100`: `--train-steps` steps of the MLP through our
    runtime calling the worker's own `Worker.checkpoint(step)` at steps 0 and 100,
    vs the same steps without, in A B / B A order. Target <= 3 %. Also printed: the checkpoint
    calls' own time as a share of the plain run. That share is far less noisy on a shared
    machine; the difference of runs also counts after-effects (write-back during training).
(c) start-up: from `runtime.Process(...)` to the end of the first `train_one_batch`, resuming from a
    snapshot (`-resume`) vs a fresh start. Target resume / fresh <= 1.2.
Sides are timed in interleaved rounds in one process; medians per side. Files go to a
temporary directory under `--dir` (default: the system's temporary directory; note its file
system, fsync on tmpfs costs nothing). Exits 0 whatever the figures.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

import singa  # noqa: F401  (first: it picks OpenBLAS's kernels before numpy loads it)
import numpy as np

import mlp_reference
from singa import checkpoint

from bench_mlp_step import (Runtime, interleaved, mlp_job, print_blas,
                            print_table)

TARGET_WRITE, TARGET_OVERHEAD, TARGET_RESUME = 1.3, 0.03, 1.2


def mlp_params(sizes, seed=0):
    """[(name, array, version)] of the MLP: w<i> (out, in) and b<i> (out,), random float32."""
    rng = np.random.default_rng(seed)
    params = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]), 1):
        params.append((f"w{i}", rng.random((n_out, n_in), dtype=np.float32), 100))
        params.append((f"b{i}", rng.random(n_out, dtype=np.float32), 100))
    return params


def numpy_write(path, arrays):
    """The baseline: raw bytes to a temporary name, flush, fsync, rename."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for a in arrays:
            a.tofile(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def filesystem(path):
    """The type of the file system holding `path` (from /proc/mounts), or '?'."""
    path, best = os.path.realpath(path), ("", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                _, mnt, fstype = line.split()[:3]
                if path.startswith(mnt) and len(mnt) > len(best[0]):
                    best = (mnt, fstype)
    except OSError:
        pass
    return best[1]


def clear(folder):
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))


def bench_write(root, sizes, rounds):
    params = mlp_params(sizes)
    arrays = [a for _, a, _ in params]
    nbytes = sum(a.nbytes for a in arrays)
    folder = os.path.join(root, "write")
    os.makedirs(folder)
    ours_path, np_path = os.path.join(folder, "step100-worker0.bin"), os.path.join(folder, "raw")

    def ours():
        checkpoint.write_file(ours_path, params)
        os.unlink(ours_path)   # a fresh file each time, like a new snapshot

    def raw():
        numpy_write(np_path, arrays)
        os.unlink(np_path)

    med = interleaved({"singa.checkpoint.write_file": ours, "numpy tofile+fsync+rename": raw},
                      rounds, 1, warmup=1)
    ratio = med["singa.checkpoint.write_file"] / med["numpy tofile+fsync+rename"]
    print(f"\n(a) write {nbytes / 1e6:.1f} MB of MLP params, {rounds} rounds, median:")
    print_table([[k, f"{t * 1e3:.1f}", f"{nbytes / t / 1e6:.0f}"] for k, t in med.items()],
                ["side", "ms", "MB/s"])
    print(f"ratio ours/numpy = {ratio:.3f} (target <= {TARGET_WRITE}: "
          f"{'within' if ratio <= TARGET_WRITE else 'ABOVE'} target)")


def bench_overhead(root, rounds, steps):
    workspace = os.path.join(root, "train")
    rt = Runtime(mlp_job(workspace))
    folder = rt.worker.folder
    seg = {"with checkpoints": [], "without": []}
    ckpt_seconds = []
    try:
        for _ in range(2):     # warm-up
            rt.train_step()
        for r in range(rounds):
            # A B, B A, ...: a load that drifts during the run weighs on both sides alike
            for side in sorted(seg, reverse=r % 2 == 0):
                t0 = time.perf_counter()
                for k in range(steps):
                    if side == "with checkpoints" and k % 100 == 0:
                        c0 = time.perf_counter()
                        rt.checkpoint()
                        ckpt_seconds.append(time.perf_counter() - c0)
                    rt.train_step()
                seg[side].append(time.perf_counter() - t0)
                clear(folder)
    finally:
        rt.close()
    med = {k: float(np.median(v)) for k, v in seg.items()}
    plain = med["without"]
    overhead = med["with checkpoints"] / plain - 1
    per_run = float(np.median(ckpt_seconds)) * len(range(0, steps, 100))
    at = ", ".join(map(str, range(0, steps, 100)))
    print(f"\n(b) {steps} training steps, checkpoint at steps {at} vs none, "
          f"{rounds} interleaved rounds, median:")
    print_table([[k, f"{med[k]:.2f}", f"{med[k] / steps * 1e3:.1f}",
                  " ".join(f"{t:.1f}" for t in v)] for k, v in seg.items()],
                ["side", "s", "ms/step", "each run (s)"])
    print(f"checkpoint call: median {np.median(ckpt_seconds) * 1e3:.0f} ms "
          f"(min {min(ckpt_seconds) * 1e3:.0f}, max {max(ckpt_seconds) * 1e3:.0f}); "
          f"calls alone = {per_run / plain:.2%} of the plain run")
    print(f"overhead = {overhead:+.2%} (target <= {TARGET_OVERHEAD:.0%}: "
          f"{'within' if overhead <= TARGET_OVERHEAD else 'ABOVE'} target)")


def start_to_first_step(workspace, resume):
    """Seconds from runtime.Process construction to the end of the first train_one_batch."""
    job = mlp_job(workspace)
    t0 = time.perf_counter()
    rt = Runtime(job, resume=resume)
    rt.worker.train_one_batch(rt.step)
    elapsed = time.perf_counter() - t0
    rt.worker.collect_all()
    restored = rt.step > 0          # resume_from set the job's step to the snapshot's
    rt.close()
    if resume and not restored:
        raise RuntimeError(f"bench: no snapshot to resume from in {workspace}")
    return elapsed


def bench_startup(root, rounds):
    fresh_ws, resume_ws = os.path.join(root, "fresh"), os.path.join(root, "resume")
    rt = Runtime(mlp_job(resume_ws))
    try:
        for _ in range(5):
            rt.train_step()
        rt.checkpoint()
        size = os.path.getsize(checkpoint.snapshot_file(rt.worker.folder, rt.step, 0))
    finally:
        rt.close()
    sides = {"fresh start": lambda: start_to_first_step(fresh_ws, False),
             "resume (-resume)": lambda: start_to_first_step(resume_ws, True)}
    for fn in sides.values():
        fn()
    times = {k: [] for k in sides}
    for r in range(rounds):
        for k in sorted(sides, reverse=r % 2 == 1):
            times[k].append(sides[k]())
    med = {k: float(np.median(v)) for k, v in times.items()}
    ratio = med["resume (-resume)"] / med["fresh start"]
    print(f"\n(c) Process(...) to end of first train_one_batch, snapshot {size / 1e6:.1f} MB, "
          f"{rounds} interleaved rounds, median:")
    print_table([[k, f"{t * 1e3:.0f}"] for k, t in med.items()], ["side", "ms"])
    print(f"ratio resume/fresh = {ratio:.3f} (target <= {TARGET_RESUME}: "
          f"{'within' if ratio <= TARGET_RESUME else 'ABOVE'} target)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10, help="(a) interleaved write rounds")
    ap.add_argument("--train-rounds", type=int, default=2, help="(b) interleaved rounds")
    ap.add_argument("--train-steps", type=int, default=200, help="(b) steps per run")
    ap.add_argument("--start-rounds", type=int, default=5, help="(c) interleaved rounds")
    ap.add_argument("--dir", default=None, help="where the temporary directory goes")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: a, b, c")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    print_blas()
    root = tempfile.mkdtemp(prefix="singa-bench-ckpt-", dir=args.dir)
    print(f"files in {root} ({filesystem(root)})")
    try:
        if "a" not in skip:
            bench_write(root, mlp_reference.SIZES, args.rounds)
        if "b" not in skip:
            bench_overhead(root, args.train_rounds, args.train_steps)
        if "c" not in skip:
            bench_startup(root, args.start_rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
