"""Bench: where a training step of ours goes, per layer and per runtime part (no reference).

    python bench/layer_times.py [--nets mlp,lenet,cifar10] [--threads 1,2] [--rounds 5]
                                [--steps 6] [--clock wall|cpu] [--stat median|min]
                                [--batch N] [--gpu]

For each net (bench_mlp_step's MLP at batch 64, bench_conv's LeNet and cifar10 net) and each
thread count, the full runtime as in those benches, timed by wrapping methods of its objects:
each layer's forward (compute_feature) and backward (compute_gradient) by the wall clock on
the worker thread; the server thread's updater (`Updater.update_many`) and the rest of its
message handling, and the stub thread's routing, by those threads' CPU time
(`time.thread_time`); the worker's own messaging: its sends of gradients
(`ParamClient.send_updates`, a bucket each) and the wait at the end of the step for the last
updates (`collect_all`), wall clock. Figures are ms per step, the
median over rounds of each round's mean. The updater and the messaging overlap the backward
pass (other threads), so the parts do not add up to the step. With `--clock cpu` the layers
and the worker's parts are timed by the worker thread's CPU time instead: what holds on a
machine shared with other work, but only at 1 thread (at more it misses the pool's share).
`--stat min` takes the fastest round instead of the median (other work only adds time).
`--batch N` sets every net's batch (default SINGA's: 64, 64, 100). `--gpu` runs the nets on
GPU 0 (`gpu: 0`) and waits for the GPU before and after each layer's pass, so a layer's time is
its kernels' and its launches' (the step's own time, without those waits, is bench_gpu.py's).
"""
import argparse
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict

import singa  # noqa: F401  (first: it picks OpenBLAS's kernels before numpy loads it)
import numpy as np

import bench_conv
from bench_mlp_step import Runtime, mlp_job, print_table
from singa.device import threads


def instrument(rt, worker_clock=time.perf_counter, sync=None):
    """Wrap rt's worker, layers, servers and stub; returns the dict of running totals (s).
    `sync`: called before and after each layer's pass (waits for a GPU)."""
    acc = defaultdict(float)

    def timed(key, fn, clock=worker_clock, wait=None):
        wait = wait or (lambda: None)

        def call(*a, **k):
            wait()
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                wait()
                acc[key] += clock() - t0
        return call

    for layer in rt.worker.train_net.layers:
        layer.compute_feature = timed((layer.name, "fwd"), layer.compute_feature, wait=sync)
        layer.compute_gradient = timed((layer.name, "bwd"), layer.compute_gradient, wait=sync)
    w = rt.worker.params
    w.send_updates = timed(("worker: send gradients", ""), w.send_updates)
    for s in rt.process.servers:
        s.updater.update_many = timed(("server: updater (CPU)", ""), s.updater.update_many,
                                      time.thread_time)
        s.handle = timed(("server: handling in all (CPU)", ""), s.handle, time.thread_time)
    st = rt.process.stub
    st.handle = timed(("stub: routing (CPU)", ""), st.handle, time.thread_time)
    return acc


def measure(rt, rounds, steps, clock=time.perf_counter, stat=np.median, sync=None):
    """{key: `stat` over rounds of ms per step}, in the order keys first appeared."""
    acc = instrument(rt, clock, sync)
    worker = rt.worker
    for _ in range(3):
        rt.train_step()
    per_round = defaultdict(list)
    for _ in range(rounds):
        time.sleep(0.2)
        acc.clear()
        t_wait = t_step = 0.0
        for _ in range(steps):
            t0 = clock()
            worker.train_one_batch(rt.step)
            t1 = clock()
            worker.collect_all()
            t2 = clock()
            rt.step += 1
            t_wait += t2 - t1
            t_step += t2 - t0
        snap = dict(acc)
        snap[("worker: wait for the last updates", "")] = t_wait
        snap[("step (worker clock)", "")] = t_step
        for key, v in snap.items():
            per_round[key].append(v / steps * 1e3)
    return {key: float(stat(v)) for key, v in per_round.items()}


def run(net, nthreads, rounds, steps, clock, stat, batch=None, gpu=False):
    workspace = tempfile.mkdtemp(prefix=f"singa-layer-times-{net}-")
    try:
        batch = batch or bench_conv.SINGA_BATCH.get(net, 64)
        job = mlp_job(workspace, batch) if net == "mlp" else \
            bench_conv.conv_job(net, workspace, batch)
        sync = None
        if gpu:
            import cupy
            job.gpu.append(0)
            sync = cupy.cuda.get_current_stream().synchronize
        with threads.limit(nthreads):
            rt = Runtime(job)
            try:
                if gpu:
                    rt.worker.device.use()
                return ([l.name for l in rt.worker.train_net.layers],
                        measure(rt, rounds, steps, clock, stat, sync))
            finally:
                rt.close()
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def table(net, counts, rounds, steps, clock_name="wall", stat_name="median", batch=None,
          gpu=False):
    """Rows: each layer's forward and backward, then the runtime's parts, per thread count."""
    clock = time.thread_time if clock_name == "cpu" else time.perf_counter
    stat = np.min if stat_name == "min" else np.median
    results = [run(net, n, rounds, steps, clock, stat, batch, gpu) for n in counts]
    names = results[0][0]
    rows = []
    for name in names:
        cells = []
        for _, r in results:
            cells += [f"{r.get((name, 'fwd'), 0):.2f}", f"{r.get((name, 'bwd'), 0):.2f}"]
        rows.append([name] + cells)
    layer_sums = []
    for _, r in results:
        layer_sums += [f"{sum(v for (n, d), v in r.items() if d == 'fwd'):.2f}",
                       f"{sum(v for (n, d), v in r.items() if d == 'bwd'):.2f}"]
    rows.append(["layers, sum"] + layer_sums)
    for key in ("worker: send gradients", "worker: wait for the last updates",
                "server: updater (CPU)", "server: handling in all (CPU)", "stub: routing (CPU)",
                "step (worker clock)"):
        rows.append([key] + sum(([f"{r.get((key, ''), 0):.2f}", ""] for _, r in results), []))
    header = ["layer / part"] + sum(([f"fwd {n}t", f"bwd {n}t"] for n in counts), [])
    print(f"{net}{' on GPU 0' if gpu else ''}, batch {batch or bench_conv.SINGA_BATCH.get(net, 64)}"
          f": ms per step ({clock_name} clock for the layers and the worker), {stat_name} "
          f"of {rounds} rounds x {steps} steps")
    print_table(rows, header)
    print()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="mlp,lenet,cifar10", help="comma-separated: mlp, lenet, cifar10")
    ap.add_argument("--threads", default="1,2", help="comma-separated compute thread counts")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="the layers' and the worker's clock: wall, or the worker thread's CPU")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="of the rounds' means per step")
    ap.add_argument("--batch", type=int, help="every net's batch (default: SINGA's)")
    ap.add_argument("--gpu", action="store_true", help="on GPU 0, waiting for it around each "
                    "layer's pass")
    args = ap.parse_args(argv)
    counts = [int(n) for n in args.threads.split(",")]
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    for net in args.nets.split(","):
        table(net, counts, args.rounds, args.steps, args.clock, args.stat, args.batch, args.gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
