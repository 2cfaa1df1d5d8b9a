"""Bench: one training step of LeNet and of the cifar10 convnet through our runtime vs numpy/torch.

    python bench/bench_conv.py [--nets lenet,cifar10] [--rounds 6] [--steps 8] [--threads N]
                               [--clock wall|cpu] [--stat median|min] [--profile]

Ours: examples/mnist/conv.conf (batch 64, on SINGA's train-1000.bin shard) and SINGA's
cifar10/job.conf net (bench/cifar10_job.conf, batch 100, on random 3x32x32 records written to
a temporary shard), built by `runtime.Process` with server and stub threads, a step being
`train_one_batch` then `collect_all` (bench_mlp_step.Runtime); the references have the same
layers, LRN included. References: `conv_reference.numpy_step` and, when torch is installed,
`torch_step`; interleaved rounds, medians per side. Every side gets --threads threads
(default os.cpu_count()): ours as its num_openblas_threads (singa/device/threads.py: BLAS at one,
the layers' work shared out over a pool), the numpy reference as BLAS threads, torch as its
own. Steps are timed by the wall clock, or with --clock cpu by the CPU time of the whole
process (every thread's, so ours counts its server and stub threads): with --threads 1 the
figure that holds on a machine shared with other work, where time slicing inflates wall
times and idle-spinning thread pools slow each other down.
Target (issue 21): ours / torch <= 1.2.
The bench measures; it exits 0 whatever the ratio.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

import singa  # first: it picks OpenBLAS's kernels before numpy loads it
import numpy as np

import conv_reference
from bench_mlp_step import (FIXTURES, Runtime, at_blas_threads, interleaved, print_blas,
                            print_table, profile, set_torch_threads)
from singa.device import threads
from singa.io.kvfile import KVFile
from singa.job import config
from singa.proto import common_pb2, job_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
LENET_CONF = os.path.join(singa.HOME, "examples", "mnist", "conv.conf")
CIFAR10_CONF = os.path.join(HERE, "cifar10_job.conf")
TARGET = 1.2
SINGA_BATCH = {"lenet": 64, "cifar10": 100}


def conv_job(net, workspace, batch=None):
    """The job of `net` ("lenet" or "cifar10") reading shards prepared in `workspace`, at
    `batch` (SINGA's, 64 or 100, by default)."""
    if net == "lenet":
        job, shard = config.load_job(LENET_CONF, check_paths=False), \
            os.path.join(FIXTURES, "train-1000.bin")
    else:
        job, shard = config.load_job(CIFAR10_CONF, check_paths=False), \
            os.path.join(workspace, "cifar10.bin")
        _random_images(shard, 1000, (3, 32, 32))
    batch = batch or SINGA_BATCH[net]
    for layer in job.neuralnet.layer:
        if layer.type == job_pb2.kRecordInput:
            sc = layer.store_conf
            sc.path, sc.random_skip, sc.batchsize[:] = shard, 0, [batch]
            sc.ClearField("mean_file")
    job.cluster.workspace = workspace
    for sub in ("checkpoint", "visualization"):
        os.makedirs(os.path.join(workspace, sub), exist_ok=True)
    return job


def _random_images(path, n, shape):
    rng = np.random.default_rng(0)
    rec = common_pb2.RecordProto(shape=list(shape))
    with KVFile(path, "create") as f:
        for i in range(n):
            rec.label = int(rng.integers(10))
            rec.pixel = rng.integers(0, 256, int(np.prod(shape)), np.uint8).tobytes()
            f.insert(b"%08d" % i, rec.SerializeToString())


def bench(net, args):
    workspace = tempfile.mkdtemp(prefix=f"singa-bench-{net}-")
    rt = Runtime(conv_job(net, workspace))
    batch = SINGA_BATCH[net]
    try:
        sides = {"ours (full runtime)": rt.train_step,
                 "numpy reference": at_blas_threads(conv_reference.numpy_step(net, batch),
                                                    args.threads)}
        torch_step = conv_reference.torch_step(net, batch)
        if torch_step is not None:
            sides["torch cpu"] = torch_step
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        med = interleaved(sides, args.rounds, args.steps, clock=clock,
                          stat=np.min if args.stat == "min" else np.median)
        ours = med["ours (full runtime)"]
        print(f"{net} step, batch {batch}, {args.rounds} rounds x {args.steps} steps per "
              f"side, {args.stat} {args.clock} ms/step:")
        print_table([[name, f"{t * 1e3:.2f}", f"{ours / t:.3f}"] for name, t in med.items()],
                    ["side", "ms/step", "ours / side"])
        if "torch cpu" in med:
            ratio = ours / med["torch cpu"]
            verdict = "within" if ratio <= TARGET else "ABOVE"
            print(f"ratio ours/torch = {ratio:.3f} (target <= {TARGET}: {verdict} target)")
        else:
            print("torch: not installed, not compared")
        if args.profile:
            profile(rt, 3 * args.steps)
    finally:
        rt.close()
        shutil.rmtree(workspace, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="lenet,cifar10", help="comma-separated: lenet, cifar10")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds")
    ap.add_argument("--steps", type=int, default=8, help="steps per side per round")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="threads of the BLAS and of torch")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time steps by the wall clock or by the process's CPU time")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="of each side's steps (min: other work on the machine only adds time)")
    ap.add_argument("--profile", action="store_true", help="profile ours after timing")
    args = ap.parse_args(argv)
    print_blas()
    set_torch_threads(args.threads)
    with threads.limit(args.threads):
        print(f"BLAS and compute threads {args.threads}")
        for net in args.nets.split(","):
            bench(net, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
