"""Parameter reuse (SINGA-12): a bigger model takes the params it shares by name with a trained
smaller one from `checkpoint_path` and initialises the rest; the log says which is which."""
import re

import numpy as np

from singa import checkpoint
from singa.proto import job_pb2

LOWER = ("0#weight1", "0#bias1")
NEW = ("0#weight_h", "0#bias_h", "0#weight3", "0#bias3")


def deeper(job):
    """784-64 (the small model's ip1 and sig1, same names) -> new 64-32 -> new 32-10 head."""
    net = job.neuralnet
    kept = [job_pb2.LayerProto() for _ in net.layer]
    for copy, layer in zip(kept, net.layer):
        copy.CopyFrom(layer)
    kept = [x for x in kept if x.name in ("data", "ip1", "sig1")]  # both data layers
    del net.layer[:]
    net.layer.extend(kept)
    add_inner_product(net, "iph", "sig1", 32, "weight_h", "bias_h")
    net.layer.add(name="sig2", type=job_pb2.kSigmoid, srclayers=["iph"])
    add_inner_product(net, "ip3", "sig2", 10, "weight3", "bias3")
    net.layer.add(name="loss", type=job_pb2.kSoftmaxLoss, srclayers=["ip3", "data"])


def add_inner_product(net, name, src, n, weight, bias):
    layer = net.layer.add(name=name, type=job_pb2.kInnerProduct, srclayers=[src])
    layer.innerproduct_conf.num_output = n
    layer.param.add(name=weight).init.CopyFrom(job_pb2.ParamGenProto(type=job_pb2.kGaussian,
                                                                     std=0.05))
    layer.param.add(name=bias).init.CopyFrom(job_pb2.ParamGenProto(type=job_pb2.kConstant,
                                                                   value=0))


def test_bigger_model_reuses_lower_params(mlp_job, run_driver, tmp_path):
    small = run_driver(mlp_job("small", workspace=tmp_path / "small"))
    assert small.returncode == 0, small.stderr
    trained = str(tmp_path / "small" / "checkpoint" / "step200-worker0.bin")
    r = run_driver(mlp_job("big", checkpoint_path=[trained], checkpoint_freq=100, edit=deeper))
    assert r.returncode == 0, r.stderr
    log = [line.split("] ", 1)[1] for line in r.stderr.splitlines() if "] " in line]
    for name in LOWER:
        assert f"Param {name}: loaded from {trained}" in log
    for name in NEW:
        assert any(re.fullmatch(rf"Param {name}: freshly initialised \(k\w+\)", x) for x in log)

    first = checkpoint.CheckpointReader(str(tmp_path / "ws" / "checkpoint" / "step0-worker0.bin"))
    source = checkpoint.CheckpointReader(trained)
    for name in LOWER:
        np.testing.assert_array_equal(first.param(name), source.param(name))
    assert first.shape("0#weight_h") == (32, 64) and first.shape("0#weight3") == (10, 32)
    for name in ("0#weight_h", "0#weight3"):   # kGaussian mean 0, std 0.05
        assert 0.04 < first.param(name).std() < 0.06 and abs(first.param(name).mean()) < 0.01
    for name in ("0#bias_h", "0#bias3"):       # kConstant 0
        assert not first.param(name).any()

    losses = [float(x) for x in re.findall(r"Train @ step \d+  Loss = ([\d.]+)", r.stderr)]
    assert len(losses) == 10 and losses[-1] < losses[0] - 0.3
