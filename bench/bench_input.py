"""Bench: one batch of SINGA's MNIST input layer (kRecordInput on a kvfile) vs numpy's floor.

    python bench/bench_input.py [--batches 64,1024] [--rounds 7] [--calls 20]

Ours: `compute_feature` of the train data layer of examples/mnist/job.conf (store_conf shape
784, mean_value and std_value 127.5) on SINGA's train-1000.bin (random_skip 0; a batch of 1024
wraps around the 1000 records): read the batch's tuples from the kvfile, decode their
RecordProtos, (x − mean) / std into the layer's blob. Floor: the same batch's pixel bytes
already in memory, one buffer, turned into float32 by numpy into the same blob, then the same
(x − mean) / std: the work no reader can skip. Sides are timed in interleaved rounds of
`--calls` calls each, in one process; medians per side, ms per batch, and ours / floor.
Exits 0 whatever the figures.
"""
import argparse
import tempfile

import singa  # noqa: F401  (first: it picks OpenBLAS's kernels before numpy loads it)
import numpy as np

from bench_mlp_step import interleaved, mlp_job, print_table
from singa.layers.base import create_layer
from singa.proto import job_pb2

FLAG = job_pb2.kTrain | job_pb2.kForward


def data_layer(batch):
    """The MNIST job's train data layer at `batch`, set up on train-1000.bin."""
    with tempfile.TemporaryDirectory() as workspace:
        job = mlp_job(workspace, batch)
    conf = next(layer for layer in job.neuralnet.layer
                if layer.type == job_pb2.kRecordInput and job_pb2.kTrain in layer.include)
    layer = create_layer(conf)
    layer.rng = np.random.default_rng(0)
    layer.setup([])
    return layer


def floor(layer):
    """numpy's part of a batch: the pixel bytes of `layer`'s first batch (back from its blob),
    in memory, to float32 in its blob, then (x − mean) / std."""
    layer.compute_feature(FLAG, [])
    raw = np.round(layer.data * layer.std + layer.mean).astype(np.uint8).tobytes()
    x = layer.data.reshape(len(layer.data), -1)

    def call():
        x[...] = np.frombuffer(raw, np.uint8).reshape(x.shape)
        np.subtract(x, layer.mean, out=x)
        np.divide(x, layer.std, out=x)
    return call


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="64,1024", help="batch sizes, comma-separated")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20, help="calls per side per round")
    args = ap.parse_args(argv)
    rows = []
    for batch in map(int, args.batches.split(",")):
        layer = data_layer(batch)
        med = interleaved({"ours": lambda: layer.compute_feature(FLAG, []),
                           "floor": floor(layer)}, args.rounds, args.calls)
        rows.append([batch, f"{med['ours'] * 1e3:.3f}", f"{med['floor'] * 1e3:.3f}",
                     f"{med['ours'] / batch * 1e6:.2f}", f"{med['ours'] / med['floor']:.1f}"])
        layer.store.close()
    print(f"MNIST kRecordInput batch on train-1000.bin, {args.rounds} rounds x {args.calls} "
          f"calls, medians:")
    print_table(rows, ["batch", "ours ms", "floor ms", "ours us/record", "ours/floor"])


if __name__ == "__main__":
    main()
