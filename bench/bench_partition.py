"""Bench: training steps per second of SINGA's MNIST MLP with 1 worker vs 2 model-parallel workers.

    python bench/bench_partition.py [--batch 64] [--rounds 3] [--steps 12]

Both run examples/mnist/job.conf (784-2500-2000-1500-1000-500-10) on train-1000.bin through
`runtime.Process(job).run()` in this process (worker, server and stub threads). The 2-worker
job cuts every InnerProduct and STanh on dim 1 (the data and loss layers on dim 0), so each
worker computes half of each layer and the halves meet through bridge layers. A run's rate is
taken between its first and last `Train @ step` lines (disp_freq 1), so setup, the Put of the
params and the final checkpoint are left out. Rounds alternate 1, 2, 1, 2, ...; medians per
side. On 2 cores shared with other work expect little gain: the point is the overhead of the
bridges and of the partition connection layers. Two workers each calling a multi-threaded
BLAS oversubscribe the cores; compare with OPENBLAS_NUM_THREADS=1 too. The bench measures;
it exits 0.
"""
import argparse
import logging
import os
import shutil
import tempfile

import singa  # noqa: F401  (first: it picks OpenBLAS's kernels before numpy loads it)
import numpy as np

from bench_mlp_step import mlp_job, print_blas
from singa.proto import job_pb2
from singa.train.runtime import Process


def job(workspace, batch, steps, workers):
    j = mlp_job(workspace, batch)
    j.train_steps, j.disp_freq, j.test_steps, j.checkpoint_freq = steps, 1, 0, 0
    if workers > 1:
        j.cluster.nworkers_per_group = j.cluster.nworkers_per_procs = workers
        j.neuralnet.partition_dim = 1
        for layer in j.neuralnet.layer:
            if layer.type in (job_pb2.kRecordInput, job_pb2.kSoftmaxLoss):
                layer.partition_dim = 0
    return j


class StepTimes(logging.Handler):
    def __init__(self):
        super().__init__()
        self.times = []

    def emit(self, record):
        if record.getMessage().startswith("Train @ step"):
            self.times.append(record.created)


def steps_per_second(workspace, batch, steps, workers):
    shutil.rmtree(workspace, ignore_errors=True)
    handler = StepTimes()
    log = logging.getLogger("singa")
    log.addHandler(handler)
    try:
        Process(job(workspace, batch, steps, workers)).run()
    finally:
        log.removeHandler(handler)
    t = handler.times
    return (len(t) - 1) / (t[-1] - t[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args(argv)
    logging.getLogger("singa").setLevel(logging.INFO)
    rates = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for workers in rates:
                rates[workers].append(steps_per_second(os.path.join(tmp, f"w{workers}"),
                                                       args.batch, args.steps, workers))
    one, two = (float(np.median(rates[w])) for w in (1, 2))
    print_blas()
    print(f"MNIST MLP, batch {args.batch}, {os.cpu_count()} cpus, {args.rounds} rounds of "
          f"{args.steps} steps")
    print(f"  1 worker                     {one:7.2f} steps/s")
    print(f"  2 workers, partition_dim 1   {two:7.2f} steps/s   ({two / one:.2f}x)")


if __name__ == "__main__":
    main()
