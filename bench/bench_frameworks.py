"""Bench: training steps per second of the MLP with 1 worker process vs 2 (Sandblaster, AllReduce).

    python bench/bench_frameworks.py [--rounds 3] [--steps 4,14] [--batch 64]

SINGA's MNIST MLP job (examples/mnist/job.conf, 12 M floats, batch 64 on train-1000.bin, no
test, display or checkpoint in the loop), each process of a layout a forked child running
`runtime.Process(...).run()` over tcp 127.0.0.1 (the driver's path without ZooKeeper, BLAS
threads limited to num_openblas_threads like the driver):
  one process      1 worker and its server in one process (the baseline)
  sandblaster      nworkers_per_group 2 (the batch split), a separate server process: 3 processes
  allreduce        nworkers_per_group 2, nservers_per_group 2, a worker and a server in each of
                   2 processes
A run's time is from handing the children their peers' endpoints to the last child's end; the
time of a step is the difference of runs of the two `--steps` counts over their difference
(setup, param init and the final checkpoint cancel out). Rounds interleave the layouts; medians.
Steps per second of a layout against the one-process job: > 1 means 2 workers train faster.
Exits 0 whatever.
"""
import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time

import singa  # noqa: F401  (first: it picks OpenBLAS's kernels before numpy loads it)
import numpy as np

from bench_mlp_step import mlp_job, print_blas, print_table
from singa.device import threads
from singa.job import topology
from singa.train.place import Place
from singa.train.runtime import Process, Transport

LAYOUTS = {
    "one process": {},
    "sandblaster": {"nworkers_per_group": 2, "server_worker_separate": True},
    "allreduce": {"nworkers_per_group": 2, "nservers_per_group": 2},
}


def bench_job(workspace, layout, steps, batch):
    job = mlp_job(workspace, batch)
    job.train_steps = steps
    job.test_steps = job.validate_steps = job.checkpoint_freq = job.disp_freq = 0
    for field, value in layout.items():
        setattr(job.cluster, field, value)
    return job


def child(pid, workspace, layout, steps, batch, conn):
    job = bench_job(workspace, layout, steps, batch)
    with threads.limit(job.num_openblas_threads):   # as the driver
        transport = Transport()
        conn.send(transport.listen("127.0.0.1"))
        endpoints = conn.recv()
        Process(job, Place(pid, topology.nprocs(job.cluster), endpoints.__getitem__,
                           transport)).run()
    conn.send("done")


def run_seconds(layout, steps, batch):
    """Wall seconds of one job of `layout` (every process a child), from go to the last end."""
    workspace = tempfile.mkdtemp(prefix="singa-bench-frameworks-")
    try:
        n = topology.nprocs(bench_job(workspace, layout, steps, batch).cluster)
        ctx = mp.get_context("fork")
        pipes = [ctx.Pipe() for _ in range(n)]
        procs = [ctx.Process(target=child, args=(pid, workspace, layout, steps, batch, c))
                 for pid, (_, c) in enumerate(pipes)]
        for p in procs:
            p.start()
        endpoints = {pid: parent.recv() for pid, (parent, _) in enumerate(pipes)}
        t0 = time.perf_counter()
        for parent, _ in pipes:
            parent.send(endpoints)
        for parent, _ in pipes:
            if not parent.poll(600) or parent.recv() != "done":
                raise RuntimeError(f"bench: a process of {layout} did not finish")
        seconds = time.perf_counter() - t0
        for p in procs:
            p.join(timeout=30)
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"bench: a process of {layout} failed")
        return seconds
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", default="4,14", help="the two train_steps counts, short,long")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args(argv)
    short, long_ = (int(x) for x in args.steps.split(","))
    print_blas()
    per_step = {name: [] for name in LAYOUTS}
    for _ in range(args.rounds):
        for name, layout in LAYOUTS.items():
            t_long = run_seconds(layout, long_, args.batch)
            t_short = run_seconds(layout, short, args.batch)
            per_step[name].append((t_long - t_short) / (long_ - short))
    med = {name: float(np.median(t)) for name, t in per_step.items()}
    base = med["one process"]
    print(f"MNIST MLP, batch {args.batch} per group, {args.rounds} rounds, steps {short} and "
          f"{long_}, median per step, {os.cpu_count()} cpus:")
    print_table([[name, f"{t * 1e3:.1f}", f"{1 / t:.2f}", f"{base / t:.2f}"]
                 for name, t in med.items()],
                ["layout", "ms/step", "steps/s", "speed vs one process"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
