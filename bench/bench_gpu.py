"""Bench: a training step on one GPU, ours against PyTorch (CUDA, eager) on the same GPU and
against ours on the CPU.

    python bench/bench_gpu.py [--rounds 3] [--steps 5] [--cpu-threads 2] [--nets mlp,lenet,cifar10]
                              [--profile FILE]

Nets: SINGA's MNIST MLP (examples/mnist/job.conf), LeNet (examples/mnist/conv.conf) and the
cifar10 convnet (bench/cifar10_job.conf), each at SINGA's batch (64, 64, 100) and at 1024,
where compute dominates (the model zoo's nets, ResNet-50 and others: bench_gpu_zoo.py).
Ours: `runtime.Process` with `gpu: 0`, server and stub in their own threads, a step being
`train_one_batch` then `collect_all` (bench_mlp_step.Runtime: gradients to the server and
its updates, on the GPU), synchronised with the GPU at its end. Torch:
the same layers (mlp_reference, conv_reference) on "cuda", synchronised at the end of each
step, in float32 throughout as ours (torch.backends.cudnn.allow_tf32 off; the column "TF32
convolutions" is torch's default, where cuDNN's convolutions round their inputs to TF32's
10-bit mantissa on the tensor cores). Ours on the CPU at --cpu-threads compute threads, at
SINGA's batches only. Interleaved rounds, medians. "compute" is ours' forward and backward
alone (no exchange, no update): the rest of a step is the Python, messaging and host-copy
overhead the step pays. "In a run":
RUN steps waited for at their end only, as a training loop runs them (ours: the worker's
loop, which looks at a step's loss once the next is queued), per step: where the host
queues a step while the GPU computes the last. At SINGA's
batches also ours on the GPU with a bucket of one param (an Update per param, each slice
updated in a launch of its own, as before buckets): what the buckets save on this GPU; and
ours op by op, without CUDA graphs (`singa.device.cuda_graphs`): what the graphs save.
Goals (issue 28): ours/torch <= 1.2 at batch 1024, <= 1.5 at SINGA's batches. Exits 0 whatever.
--profile FILE: then a profile of ours on the GPU (the MLP at batch 64), every thread of the
runtime (worker, stub, servers) sampled apart, into FILE: where the host's time goes.
"""
import argparse
import collections
import os
import shutil
import sys
import tempfile
import threading
import time

import singa  # noqa: F401  (first: it picks OpenBLAS's kernels before numpy loads it)
import numpy as np

import conv_reference
import mlp_reference
from bench_conv import SINGA_BATCH, conv_job
from bench_mlp_step import Runtime, interleaved, mlp_job, print_table
from singa.device import threads
from singa.layers import kernels

GOALS = {"singa": 1.5, "1024": 1.2}


def job_of(net, workspace, batch, gpu):
    job = mlp_job(workspace, batch) if net == "mlp" else conv_job(net, workspace, batch)
    job.test_steps = job.validate_steps = job.disp_freq = job.checkpoint_freq = 0
    if gpu:
        job.gpu.append(0)
    return job


def synced(fn):
    """`fn`, then wait for the GPU to finish what it queued."""
    import cupy

    def call():
        fn()
        cupy.cuda.get_current_stream().synchronize()
    return call


def in_a_run(step, finish, n):
    """`n` calls of `step`, then `finish` (waiting for the GPU): one call, of n steps."""
    def call():
        for _ in range(n):
            step()
        finish()
    return call


def finish_run(rt):
    """What ends a run of ours: the last loss looked at, the GPU waited for."""
    import cupy

    def finish():
        rt.worker.loss_check.flush()
        cupy.cuda.get_current_stream().synchronize()
    return finish


def compute_only(rt):
    """Forward and backward of ours' train net (no exchange, no update), as its steps run
    them (runs of passes as CUDA graphs once captured)."""
    graphs = rt.worker.graphs

    def step():
        for segment in graphs.segments:
            graphs.run(segment)
    return step


def torch_step(net, batch, sync=True, tf32=False):
    """Torch's step of `net` on "cuda": in float32 throughout as ours (`tf32` False), or with
    cuDNN's convolutions in TF32 (`tf32`), torch's default (its products stay float32)."""
    import torch
    step = (mlp_reference.torch_step(batch, device="cuda", sync=sync) if net == "mlp" else
            conv_reference.torch_step(net, batch, device="cuda", sync=sync))

    def call():
        torch.backends.cudnn.allow_tf32 = tf32
        step()
    return call


def bench(net, batch, args):
    """{side: median seconds per step} of `net` at `batch`."""
    folders = [tempfile.mkdtemp(prefix=f"singa-bench-gpu-{net}-") for _ in range(4)]
    runtimes = []
    try:
        gpu = Runtime(job_of(net, folders[0], batch, True))
        runtimes.append(gpu)
        gpu.worker.device.use()
        import torch
        sides = {"ours gpu": synced(gpu.train_step), "ours gpu compute": synced(compute_only(gpu)),
                 "torch gpu": torch_step(net, batch),
                 RUN_OURS: in_a_run(gpu.run_step, finish_run(gpu), RUN),
                 RUN_TORCH: in_a_run(torch_step(net, batch, sync=False), torch.cuda.synchronize,
                                     RUN)}
        if net != "mlp":
            sides[TORCH_TF32] = torch_step(net, batch, tf32=True)
        if batch == SINGA_BATCH.get(net, 64):
            single = Runtime(job_of(net, folders[2], batch, True))
            runtimes.append(single)
            single.worker.params.bucket_cap = 0     # a message per param, as before buckets
            sides[PER_PARAM] = synced(single.train_step)
            by_op = Runtime(job_of(net, folders[3], batch, True))
            runtimes.append(by_op)
            by_op.worker.graphs.capture = False
            sides[OP_BY_OP] = synced(by_op.train_step)
            with threads.limit(args.cpu_threads):
                cpu = Runtime(job_of(net, folders[1], batch, False))
            runtimes.append(cpu)

            def cpu_step():
                with threads.limit(args.cpu_threads):
                    cpu.train_step()
            sides["ours cpu"] = cpu_step
        return interleaved(sides, args.rounds, args.steps)
    finally:
        for rt in runtimes:
            rt.close()
        for f in folders:
            shutil.rmtree(f, ignore_errors=True)


def profile_threads(path, net="mlp", batch=64, steps=200, interval=0.0005):
    """Where each thread of ours on the GPU spends `steps` steps, into `path`: the stacks of all
    threads sampled every `interval` s (sys._current_frames; cProfile profiles one thread at a
    time from Python 3.12), per thread the functions most often running (self) and on the stack
    (inclusive), in % of its samples. A sample lands where the thread was when the sampler got
    the GIL, so waits show as the calls that released it."""
    folder = tempfile.mkdtemp(prefix="singa-bench-gpu-profile-")
    samples = collections.defaultdict(lambda: [0, collections.Counter(), collections.Counter()])
    done = threading.Event()

    def sample():
        me = threading.get_ident()
        while not done.wait(interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                entry = samples[names.get(ident, str(ident))]
                entry[0] += 1
                entry[1][_where(frame)] += 1
                seen = set()
                while frame is not None:
                    seen.add(_where(frame))
                    frame = frame.f_back
                entry[2].update(seen)
    try:
        rt = Runtime(job_of(net, folder, batch, True))
        step = synced(rt.train_step)
        for _ in range(5):
            step()
        sampler = threading.Thread(target=sample, name="sampler", daemon=True)
        sampler.start()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        took = time.perf_counter() - start
        done.set()
        sampler.join()
        rt.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    with open(path, "w") as f:
        f.write(f"{net} at batch {batch} on GPU 0: {steps} steps after 5, "
                f"{took / steps * 1e3:.2f} ms a step; each thread's stack sampled every "
                f"{interval * 1e3:g} ms\n")
        for name, (count, top, anywhere) in sorted(samples.items(), key=lambda kv: -kv[1][0]):
            for what, counter in (("self", top), ("inclusive", anywhere)):
                f.write(f"\n===== thread {name}: {count} samples, by {what}\n")
                for where, n in counter.most_common(30):
                    f.write(f"{100 * n / count:6.1f}%  {where}\n")
    print(f"profile of ours ({net}, batch {batch}) in {path}")


def _where(frame):
    code = frame.f_code
    return f"{os.path.relpath(code.co_filename)}:{code.co_firstlineno}({code.co_name})"


def print_gpu_engine():
    """Which engine runs our convolutions on GPU 0 (cuDNN, or im2col + cuBLAS: why)."""
    engine = kernels.gpu_engine(0)
    print("our convolutions on the GPU: " + (f"cuDNN {engine.version()}" if engine else
                                             "im2col + cuBLAS")
          + f" (SINGA_GPU_KERNELS={os.environ.get('SINGA_GPU_KERNELS', 'unset')})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="mlp,lenet,cifar10")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--cpu-threads", type=int, default=2)
    ap.add_argument("--profile", metavar="FILE", help="then profile ours (see above) into FILE")
    args = ap.parse_args(argv)
    import cupy
    import torch
    props = cupy.cuda.runtime.getDeviceProperties(0)
    print(f"GPU 0: {props['name'].decode()}, CuPy {cupy.__version__}, torch {torch.__version__} "
          f"(CUDA {torch.version.cuda}), numpy {np.__version__}, {os.cpu_count()} cpus")
    print_gpu_engine()
    rows = []
    for net in args.nets.split(","):
        for batch in (SINGA_BATCH.get(net, 64), 1024):
            med = bench(net, batch, args)
            ours, torch_t = med["ours gpu"], med["torch gpu"]
            goal = GOALS["1024" if batch == 1024 else "singa"]
            cpu, single, by_op = med.get("ours cpu"), med.get(PER_PARAM), med.get(OP_BY_OP)
            run_ours, run_torch = med[RUN_OURS] / RUN, med[RUN_TORCH] / RUN
            tf32 = med.get(TORCH_TF32)
            rows.append([net, batch, f"{ours * 1e3:.2f}", f"{med['ours gpu compute'] * 1e3:.2f}",
                         f"{(ours - med['ours gpu compute']) * 1e3:.2f}",
                         f"{torch_t * 1e3:.2f}", f"{ours / torch_t:.2f}",
                         f"<= {goal}: {'yes' if ours / torch_t <= goal else 'NO'}",
                         "-" if tf32 is None else f"{tf32 * 1e3:.2f}",
                         "-" if tf32 is None else f"{ours / tf32:.2f}",
                         f"{run_ours * 1e3:.2f}", f"{run_torch * 1e3:.2f}",
                         f"{run_ours / run_torch:.2f}",
                         "-" if by_op is None else f"{by_op * 1e3:.2f}",
                         "-" if single is None else f"{single * 1e3:.2f}",
                         "-" if cpu is None else f"{cpu * 1e3:.1f}",
                         "-" if cpu is None else f"{cpu / ours:.1f}"])
            print_table(rows[-1:], HEADER)
    print(f"\nsummary, {args.rounds} rounds x {args.steps} steps per side, median ms/step:")
    print_table(rows, HEADER)
    if args.profile:
        profile_threads(args.profile)
    return 0


PER_PARAM = "ours gpu, an Update per param"
OP_BY_OP = "ours gpu, op by op (no CUDA graphs)"
#: steps of a run, the GPU waited for only at its end, as training waits: the host queues a
#: step while the GPU computes the last
RUN = 5
RUN_OURS, RUN_TORCH = "ours gpu, in a run", "torch gpu, in a run"
#: torch as it runs by default: cuDNN's convolutions in TF32 (10-bit mantissas), where ours
#: and "torch gpu" compute in float32
TORCH_TF32 = "torch gpu, TF32 convolutions (its default)"
HEADER = ["net", "batch", "ours gpu", "compute", "overhead", "torch gpu", "ours/torch", "goal",
          TORCH_TF32, "ours/torch TF32",
          RUN_OURS, RUN_TORCH, "ours/torch in a run", OP_BY_OP, PER_PARAM, "ours cpu",
          "cpu/gpu"]

if __name__ == "__main__":
    sys.exit(main())
