"""The Python API's own cost: a fit whose callbacks hear every step against the same fit
without callbacks, and evaluate's whole pass over N samples (a tail net for the last partial
batch) against SINGA's test_steps over the same full batches.

Interleaved rounds (A, B, A, B ...), median per side; prints ms per step of each side, the
difference per step and the ratio. Data: the SINGA 0.3 MNIST shard in tests/fixtures.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import singa  # noqa: F401  (before numpy: its OpenBLAS kernel choice holds here too)
import numpy as np

from singa.callbacks import EarlyStopping, LambdaCallback
from singa.io.kvfile import KVFile
from singa.io.records import decode_batch
from singa.model import SGD, Cluster, Dense, Sequential

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "fixtures", "singa-0.3", "train-1000.bin")


def model(workspace):
    m = Sequential('bench')
    m.add(Dense(256, init='uniform', activation='tanh'))
    m.add(Dense(10, init='uniform', activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.05, momentum=0.9),
              cluster=Cluster(workspace))
    return m


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--samples", type=int, default=1000, help="evaluated samples (a tail when "
                    "not a multiple of 64)")
    args = ap.parse_args()
    with KVFile(DATA) as f:
        x, y = decode_batch([v for _, v in f], 784)
    x /= np.float32(255)
    heard = []
    callbacks = [LambdaCallback(on_step_end=lambda step, metrics: heard.append(step)),
                 EarlyStopping(monitor='train/loss', patience=10 ** 9)]
    with tempfile.TemporaryDirectory() as tmp:
        fits = {"plain": [], "callbacks": []}
        for r in range(args.rounds):
            for name, cbs in (("plain", ()), ("callbacks", callbacks)):
                m = model(os.path.join(tmp, f"{name}{r}"))     # a fresh fit each round
                fits[name].append(timed(lambda: m.fit(
                    x, y, nb_epoch=args.steps, disp_freq=1, seed=1, progress=False,
                    callbacks=list(cbs))) / args.steps * 1e3)
                time.sleep(0.2)
        trained = m                 # the last fit: the params evaluate reads
        n = args.samples
        xe = np.concatenate([x] * (n // len(x) + 1))[:n]
        ye = np.concatenate([y] * (n // len(y) + 1))[:n]
        full = n // 64
        evals = {"test_steps": [], "whole pass": []}
        for _ in range(args.rounds):
            evals["test_steps"].append(timed(lambda: trained.evaluate(
                xe, ye, test_steps=full, verbose=0)) * 1e3)
            time.sleep(0.2)
            evals["whole pass"].append(timed(lambda: trained.evaluate(xe, ye, verbose=0)) * 1e3)
            time.sleep(0.2)
    f = {k: statistics.median(v) for k, v in fits.items()}
    e = {k: statistics.median(v) for k, v in evals.items()}
    print(f"fit, {args.steps} steps of a 784-256-10 MLP (batch 64), every step displayed:")
    print(f"  plain      {f['plain']:.3f} ms/step")
    print(f"  callbacks  {f['callbacks']:.3f} ms/step  (LambdaCallback + EarlyStopping hear "
          f"every step; {len(heard)} calls)")
    print(f"  overhead   {f['callbacks'] - f['plain']:+.3f} ms/step, ratio "
          f"{f['callbacks'] / f['plain']:.3f}")
    print(f"evaluate of {n} samples ({full} batches of 64 + a tail of {n - 64 * full}):")
    print(f"  test_steps={full} (the full batches only)  {e['test_steps']:.1f} ms")
    print(f"  whole pass (every sample once)         {e['whole pass']:.1f} ms, ratio "
          f"{e['whole pass'] / e['test_steps']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
