"""examples/alexnet: SINGA's job.conf (and cudnn.conf, its cuDNN layer types run on the CPU)
builds AlexNet and trains a few steps on records that gen_records.py generates in ImageNet's
record layout (batch sizes cut from 256/100 to 4)."""
import math
import os
import re
import subprocess

import pytest

import singa
from conftest import PYTHON
from singa.checkpoint import CheckpointReader

HERE = os.path.join(singa.HOME, "examples", "alexnet")
CONFS = {"job.conf": os.path.join(HERE, "job.conf"),
         "cudnn.conf": os.path.join(singa.HOME, "tests", "fixtures", "confs", "alexnet", "cudnn.conf")}


@pytest.mark.parametrize("name", CONFS)
def test_alexnet_conf_builds_and_trains_steps_on_generated_records(tmp_path, run_driver, name):
    data = tmp_path / "imagenet"
    data.mkdir()
    made = subprocess.run([PYTHON, os.path.join(HERE, "gen_records.py"), "--out-dir", str(data),
                           "--train", "8", "--val", "4"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    with open(CONFS[name]) as f:
        text = f.read()
    for old, new in (("/data/dataset/imagenet/", f"{data}/"), ("batchsize: 256", "batchsize: 4"),
                     ("batchsize: 100", "batchsize: 4"), ("train_steps: 450000", "train_steps: 3"),
                     ("test_steps: 500", "test_steps: 1"), ("disp_freq: 20", "disp_freq: 1"),
                     ('workspace: "examples/alexnet"', f'workspace: "{tmp_path / "ws"}"')):
        assert old in text, old
        text = text.replace(old, new)
    conf = tmp_path / "job.conf"
    conf.write_text(re.sub(r"(?m)^gpu: \d+\n", "", text))     # no GPU here: the CPU runs it

    r = run_driver(conf)
    assert r.returncode == 0, r.stderr
    losses = [float(x) for x in re.findall(r"Train @ step (?:\d+)  Loss = ([\d.]+)", r.stderr)]
    assert len(losses) == 3 and all(math.isfinite(x) and x > 0 for x in losses), losses
    # cudnn.conf tests with kAccuracy alone (its kCudnnSoftmaxLoss is kTrain only)
    assert re.search(r"Test @ step 0\n.*   (Loss = [\d.]+, )?accuracy = [\d.]+", r.stderr)
    snapshot = CheckpointReader(str(tmp_path / "ws" / "checkpoint" / "step3-worker0.bin"))
    shapes = {name: tuple(shape) for name, shape, _, _ in snapshot.meta()}
    # conv1 96@11x11 on 3 channels of the 227x227 crop; ip6 reads pool5's 256x6x6
    assert shapes["0#w1"] == (96, 3 * 11 * 11) and shapes["0#w6"] == (4096, 256 * 6 * 6)
    assert shapes["0#w8"] == (1000, 4096) and len(shapes) == 16
