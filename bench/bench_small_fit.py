"""A small net's step through `fit` against torch's (issue 48): the runtime's per-step cost.

    python bench/bench_small_fit.py [--rounds 3] [--steps 4000] [--threads 1] [--uint8]

Ours: a 784-128-10 MLP (ReLU, softmax loss, SGD) at batch 64 trained by `Sequential.fit` on the
SINGA 0.3 MNIST shard of tests/fixtures (1,000 samples, float x scaled to [0, 1]; `--uint8`:
the raw pixels), a one-process job (worker, server and stub threads in this process). A fit
of `--steps` steps and one of a tenth of them are timed; their difference per step is the
marginal step (the fixed cost of a fit, its setup and its last snapshot, is printed beside).
torch: the same net and batch, a plain loop of zero_grad, forward, loss, backward, SGD step on
tensors sliced from the same data (no data loader), when torch is installed. Rounds alternate
ours and torch; medians per side. Threads: BLAS / torch's intra-op threads. The bench
measures; it exits 0 whatever the ratio.
"""
import argparse
import os
import statistics
import tempfile
import time

import singa  # noqa: F401  (before numpy: its OpenBLAS kernel choice holds here too)
import numpy as np
from threadpoolctl import threadpool_limits

from singa.io.kvfile import KVFile
from singa.io.records import decode_batch
from singa.model import Cluster, Dense, Sequential

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "fixtures", "singa-0.3", "train-1000.bin")
BATCH = 64


def ours(x, y, steps):
    """Seconds of a fit of `steps` steps (a fresh model and workspace)."""
    with tempfile.TemporaryDirectory() as ws:
        m = Sequential('small')
        m.add(Dense(128, init='uniform', activation='relu'))
        m.add(Dense(10, init='uniform', activation='softmax'))
        m.compile(loss='categorical_crossentropy', optimizer='sgd', cluster=Cluster(ws))
        t0 = time.perf_counter()
        m.fit(x, y, batch_size=BATCH, nb_epoch=steps, disp_freq=100, seed=1, progress=False,
              verbose=0)
        return time.perf_counter() - t0


def torch_loop(x, y):
    """A callable running n steps of torch's loop, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    xt, yt = torch.tensor(x.astype(np.float32)), torch.tensor(y.astype(np.int64))
    net = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                              torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_of = torch.nn.CrossEntropyLoss()

    def run(n):
        for s in range(n):
            i = (s * BATCH) % (len(xt) - BATCH)
            opt.zero_grad()
            loss = loss_of(net(xt[i:i + BATCH]), yt[i:i + BATCH])
            loss.backward()
            opt.step()
            if s % 100 == 0:        # as a display reads the loss
                float(loss.detach())
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--uint8", action="store_true", help="x as the shard's raw pixels")
    args = ap.parse_args()
    with KVFile(DATA) as f:
        x, y = decode_batch([v for _, v in f], 784)
    x = x.astype(np.uint8) if args.uint8 else x / 255
    long, short = args.steps, max(args.steps // 10, 1)
    loop = torch_loop(x, y)
    if loop is not None:
        import torch
        torch.set_num_threads(args.threads)
        loop(200)                       # warm-up
    marginal, fixed, theirs = [], [], []
    with threadpool_limits(args.threads):
        ours(x, y, short)               # warm-up: imports, numba's compilations
        for _ in range(args.rounds):
            a, b = ours(x, y, long), ours(x, y, short)
            marginal.append((a - b) / (long - short))
            fixed.append(b - short * marginal[-1])
            if loop is not None:
                t0 = time.perf_counter()
                loop(long)
                theirs.append((time.perf_counter() - t0) / long)
    step, setup = statistics.median(marginal), statistics.median(fixed)
    print(f"784-128-10 MLP, batch {BATCH}, {'uint8' if args.uint8 else 'float'} x, "
          f"{args.threads} thread(s), {args.rounds} rounds, medians")
    print(f"ours through fit: {1e3 * step:.3f} ms/step marginal ({1 / step:.0f} steps/s), "
          f"{setup:.2f} s fixed per fit")
    if theirs:
        t = statistics.median(theirs)
        print(f"torch loop:       {1e3 * t:.3f} ms/step ({1 / t:.0f} steps/s)")
        print(f"ours / torch = {step / t:.2f} (target <= 1.5)")
    else:
        print("torch: not installed, not compared")


if __name__ == "__main__":
    main()
