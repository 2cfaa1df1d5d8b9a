"""Helpers of the export tests: a job conf written to a folder, a snapshot of freshly
initialised params (biases moved off their constants) for a conf."""
import os

import numpy as np

from singa.checkpoint.format import write_file
from singa.interop import deploy
from singa.job import config
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2


def write_conf(folder, text, name="job.conf"):
    """`text` (its WORKSPACE replaced by `folder`) as `folder/name`; the path."""
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(text.replace("WORKSPACE", str(folder)))
    return path


def fresh_snapshot(conf, folder, step=5, seed=1):
    """Write `folder/step<step>-worker0.bin`: the conf's params as its init methods make
    them, biases plus N(0, 0.1); returns its path."""
    job = config.load_job(os.path.abspath(conf), check_paths=False)
    net = NeuralNet(deploy.deploy_net(job.neuralnet, conf), job_pb2.kTrain,
                    np.random.default_rng(0))
    rng = np.random.default_rng(seed)
    for p in net.owner_params:
        p.init_values(rng)
        if p.data.ndim == 1:
            p.data += rng.normal(0, 0.1, p.data.shape).astype(np.float32)
    os.makedirs(folder, exist_ok=True)
    return write_file(os.path.join(folder, f"step{step}-worker0"),
                      [(p.name, p.data, step) for p in net.owner_params])
