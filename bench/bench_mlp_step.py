"""Bench: one training step of SINGA's MNIST MLP through our full runtime vs hand-written numpy.

    python bench/bench_mlp_step.py [--batch 64] [--rounds 10] [--steps 5] [--threads N]
                                   [--clock wall|cpu] [--stat median|min] [--profile]
                                   [--width W]

Ours: examples/mnist/job.conf (784-2500-2000-1500-1000-500-10, STanh, softmax loss, SGD) on
SINGA's train-1000.bin shard, built by `runtime.Process`; the server and the stub run
in their own threads, the worker is driven here. A step is `train_one_batch(step)` then
`collect_all()`: forward, backward, gradients to the server through the stub, updates applied
and their new versions back, like the reference's in-place SGD. Reference:
`mlp_reference.numpy_step` (and `torch_step` when torch is installed), timed in the same
process in interleaved rounds (ours, numpy, torch, ours, ...); medians per side. Target:
ours / numpy <= 1.15. The bench measures; it exits 0 whatever the ratio.
`--width 8 --batch 1` makes every hidden layer 8 units wide (12 params still): the step is then
nearly all the runtime's per-step overhead (messages through the stub, the server's updates),
which ours minus numpy's time gives. "exchange only" is that overhead alone: an Update of every
param's gradient, then `collect_all`, without the forward and backward.
"""
import argparse
import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import threading
import time

import singa  # noqa: F401  (first: it picks OpenBLAS's kernels before numpy loads it)
import numpy as np
from threadpoolctl import threadpool_info

import mlp_reference
from singa.comm import msg as m
from singa.device import CPU, threads
from singa.job import config
from singa.layers import kernels
from singa.proto import job_pb2
from singa.train.runtime import Process, resume_from

FIXTURES = os.path.join(singa.HOME, "tests", "fixtures", "singa-0.3")
MNIST_CONF = os.path.join(singa.HOME, "examples", "mnist", "job.conf")
TARGET = 1.15
EXCHANGE = "ours: exchange only"


def mlp_job(workspace, batch=64, width=None):
    """SINGA's MNIST MLP job: train on train-1000.bin (random_skip 0), test on test-500.bin;
    its hidden layers `width` units wide if given."""
    job = config.load_job(MNIST_CONF, check_paths=False)
    sizes = iter(mlp_reference.hidden(width)[1:])
    for layer in job.neuralnet.layer:
        if layer.type == job_pb2.kInnerProduct:
            layer.innerproduct_conf.num_output = next(sizes)
        if layer.type != job_pb2.kRecordInput:
            continue
        sc = layer.store_conf
        if job_pb2.kTrain in layer.include:
            sc.path = os.path.join(FIXTURES, "train-1000.bin")
            sc.random_skip = 0
            sc.batchsize[:] = [batch]
        else:
            sc.path = os.path.join(FIXTURES, "test-500.bin")
    job.cluster.workspace = workspace
    for sub in ("checkpoint", "visualization"):     # what the driver makes before setup
        os.makedirs(os.path.join(workspace, sub), exist_ok=True)
    return job


class Runtime:
    """Our runtime for `job`: executors set up, server and stub threads running, params Put.

    With `resume`, the driver continues from the newest snapshot in the job's workspace.
    """

    def __init__(self, job, resume=False):
        folder = os.path.join(job.cluster.workspace, "checkpoint")
        self.process = p = Process(job, resume=resume_from(job, folder) if resume else None)
        self.worker = p.workers[0]
        self.failure = None
        self.threads = [threading.Thread(target=x.run, name=f"server-{x.grp}-{x.id}", daemon=True)
                        for x in p.servers]
        self.threads.append(threading.Thread(target=self.route, name="stub", daemon=True))
        for t in self.threads:
            t.start()
        self.worker.init_params()
        self.step = job.step

    def route(self):
        self.failure = self.process.stub.run()

    def train_step(self):
        """One step, ended when every param's update has come back from the server."""
        self.worker.train_one_batch(self.step)
        self.worker.collect_all()
        self.step += 1

    def run_step(self):
        """One step as the worker's loop takes it: its loss looked at once the next step is
        queued (on a GPU), the updates collected before the next forward pass."""
        w = self.worker
        w.train_one_batch(self.step)
        w.params.send_updates()
        w.loss_check.check(self.step)
        w.collect_all()
        self.step += 1

    def exchange_step(self):
        """The exchange alone: an Update of each param's gradient as it stands (in the
        backward's order), then `collect_all`; no forward or backward."""
        w = self.worker
        for layer in reversed(w.train_net.layers):
            for p in layer.params:
                w.params.update(self.step, p)
        w.collect_all()
        self.step += 1

    def checkpoint(self):
        self.worker.checkpoint(self.step)

    def close(self):
        w = self.worker
        w.dealer.send(m.Msg(w.address, m.STUB, m.kStop))   # the stub then stops the servers
        for t in self.threads:
            t.join(timeout=30)
            if t.is_alive():
                raise RuntimeError(f"bench: thread {t.name} did not stop")
        self.process.close()
        if self.failure is not None:
            raise RuntimeError(f"bench: an executor failed: {self.failure}")


def per_call_seconds(fn, n, clock=time.perf_counter):
    """Seconds of each of `n` calls of `fn`, by `clock`."""
    out = []
    for _ in range(n):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def interleaved(sides, rounds, n, warmup=2, clock=time.perf_counter, settle=0.2, stat=np.median):
    """{name: `stat` (median) of seconds per call}: rounds of `n` calls of each side in turn,
    after warm-up.
    Each turn starts `settle` seconds after the last: BLAS's threads spin for a while after
    their last product, and would take a core from the next side."""
    for fn in sides.values():
        per_call_seconds(fn, warmup)
    times = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            time.sleep(settle)
            times[name] += per_call_seconds(fn, n, clock)
    return {name: float(stat(t)) for name, t in times.items()}


def at_blas_threads(fn, n):
    """`fn` called with BLAS at `n` threads: a reference's setting inside `threads.limit(n)`,
    where ours runs BLAS at one and shares its work out over n threads of its own."""
    def call():
        with threads.blas_threads(n):
            return fn()
    return call


def set_torch_threads(n):
    """torch, when installed, at `n` threads (and a line saying so)."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(n)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")


def print_blas():
    """The BLAS numpy uses, the kernels it loaded and the BLAS env vars, in a few lines."""
    cfg = np.show_config(mode="dicts")
    blas = cfg.get("Build Dependencies", {}).get("blas", {})
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("OPENBLAS", "OMP_", "MKL_", "GOTO"))}
    cores = {i.get("architecture") for i in threadpool_info() if i.get("user_api") == "blas"}
    print(f"numpy {np.__version__}, BLAS {blas.get('name', '?')} {blas.get('version', '')} "
          f"({blas.get('openblas configuration', '').strip()}; kernels {', '.join(cores)}); "
          f"cpus {os.cpu_count()}; "
          f"env {env or 'no BLAS/OMP thread variables set'}")
    # a venv without numba runs numpy's passes (MobileNet's forward 250 against 170 ms)
    conv = kernels.convolution(CPU)
    print(f"our kernels {kernels.choose(CPU).__name__.rpartition('.')[2]}, convolution on "
          + (f"oneDNN {conv.version()}" if conv else "im2col + BLAS"))


def print_table(rows, header):
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def profile(rt, steps):
    """Top functions by cumulative and own time over `steps` of ours (worker thread only)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        rt.train_step()
    prof.disable()
    for key in ("cumulative", "tottime"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(15)
        lines = s.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if "ncalls" in line)
        print(f"--- profile of {steps} steps of ours (worker thread), by {key} ---")
        print("\n".join(line for line in lines[start:] if line.strip()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    ap.add_argument("--steps", type=int, default=5, help="steps per side per round")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="compute threads of ours (num_openblas_threads), of the reference's "
                         "BLAS and of torch")
    ap.add_argument("--profile", action="store_true", help="profile ours even if within target")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time steps by the wall clock or by the process's CPU time")
    ap.add_argument("--width", type=int, help="units of every hidden layer (SINGA's: "
                    "2500-2000-1500-1000-500)")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="of each side's steps (min: other work on the machine only adds time)")
    args = ap.parse_args(argv)
    print_blas()
    set_torch_threads(args.threads)
    print(f"threads {args.threads}")
    workspace = tempfile.mkdtemp(prefix="singa-bench-mlp-")
    with threads.limit(args.threads):
        rt = Runtime(mlp_job(workspace, args.batch, args.width))
        try:
            bench(rt, args)
        finally:
            rt.close()
            shutil.rmtree(workspace, ignore_errors=True)
    return 0


def bench(rt, args):
    sizes = mlp_reference.hidden(args.width)
    sides = {"ours (full runtime)": rt.train_step,
             EXCHANGE: rt.exchange_step,
             "numpy reference": at_blas_threads(mlp_reference.numpy_step(args.batch,
                                                                         sizes=sizes),
                                                args.threads)}
    torch_step = mlp_reference.torch_step(args.batch, sizes=sizes)
    if torch_step is not None:
        sides["torch cpu"] = torch_step
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    med = interleaved(sides, args.rounds, args.steps, clock=clock,
                      stat=np.min if args.stat == "min" else np.median)
    ratio = med["ours (full runtime)"] / med["numpy reference"]
    flops = mlp_reference.flops_per_step(args.batch, sizes)
    print(f"MNIST MLP step ({'-'.join(map(str, sizes))}), batch {args.batch}, "
          f"{args.rounds} rounds x {args.steps} steps "
          f"per side, {args.stat} {args.clock} ms/step ({flops / 1e9:.2f} GFLOP/step):")
    print_table([[name, f"{t * 1e3:.2f}", "-" if name == EXCHANGE else f"{flops / t / 1e9:.1f}"]
                 for name, t in med.items()], ["side", "ms/step", "GFLOP/s"])
    if "torch cpu" not in med:
        print("torch: not installed, not compared")
    verdict = "within" if ratio <= TARGET else "ABOVE"
    print(f"ratio ours/numpy = {ratio:.3f} (target <= {TARGET}: {verdict} target)")
    if "torch cpu" in med:
        print(f"ratio ours/torch = {med['ours (full runtime)'] / med['torch cpu']:.3f} "
              f"(issue 21's target <= 1.0)")
    if args.profile or ratio > TARGET:
        profile(rt, 3 * args.steps)


if __name__ == "__main__":
    sys.exit(main())
