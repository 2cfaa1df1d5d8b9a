"""Model partitioning: the MNIST MLP trained by 1 worker, by 2 at partition_dim 0 and by 2 at
partition_dim 1 (synchronous, same seed, same data) follows one loss curve."""
import logging
import os
import re

import numpy as np
import pytest

import singa
from singa.config import parse_job
from singa.runtime import Process

FIXTURES = os.path.join(singa.HOME, "tests", "fixtures", "singa-0.3")
TWO = "nworkers_per_group: 2 nworkers_per_procs: 2"
# the features of ip1, sig1 and ip2 cut over the workers; the data and loss cut the batch
DIM1 = {"neuralnet {": "neuralnet { partition_dim: 1",
        'name: "data" type: kRecordInput': 'name: "data" partition_dim: 0 type: kRecordInput',
        'name: "loss" type: kSoftmaxLoss': 'name: "loss" partition_dim: 0 type: kSoftmaxLoss'}
TRAIN = re.compile(r"Train @ step (\d+)  Loss = ([\d.]+), accuracy = ([\d.]+)")
STEPS = 30


def job_conf(tmp_path, name, cluster="", edits=None):
    with open(os.path.join(FIXTURES, "job.conf")) as f:
        text = f.read().replace("/tmp/singa-fixture-ws", str(tmp_path / name))
    edits = {"train_steps: 200": f"train_steps: {STEPS}", "disp_freq: 20": "disp_freq: 1",
             "test_freq: 100": "test_freq: 20", "checkpoint_freq: 100": "checkpoint_freq: 0",
             "nserver_groups: 1": f"nserver_groups: 1 {cluster}", **(edits or {})}
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    os.makedirs(tmp_path / name / "checkpoint")
    return parse_job("seed: 7\n" + text, name)


def train_in_process(job, caplog):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="singa"):
        Process(job).run()
    lines = [r.getMessage() for r in caplog.records]
    curve = [(int(m[1]), float(m[2]), float(m[3])) for m in map(TRAIN.fullmatch, lines) if m]
    return curve, lines


@pytest.mark.parametrize("dims", ["dim0", "dim1"])
def test_two_workers_follow_the_loss_curve_of_one(dims, tmp_path, caplog):
    one, _ = train_in_process(job_conf(tmp_path, "one"), caplog)
    two, lines = train_in_process(job_conf(tmp_path, dims, TWO, DIM1 if dims == "dim1" else None),
                                  caplog)
    assert [s for s, _, _ in one] == [s for s, _, _ in two] == list(range(STEPS))
    assert one[-1][1] < one[0][1]
    diff = max(abs(a[1] - b[1]) for a, b in zip(one, two))
    print(f"{dims}: max loss difference over {STEPS} steps = {diff:.2e}")
    assert diff < 1e-5       # the same sums cut differently: float32 rounding, 6 printed decimals
    np.testing.assert_allclose([a for _, _, a in two], [a for _, _, a in one], atol=1e-5)
    assert sum(line.startswith("Test @ step") for line in lines) == 2
