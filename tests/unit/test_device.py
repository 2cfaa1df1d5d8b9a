"""singa.device on a machine without a GPU: the checks of `gpu` (one line, file and line, the
extra to install), SINGA's rule giving ids to workers, and the CPU path that never imports
CuPy. The GPU itself is tested by tests/gpu/."""
import importlib.util
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest

import singa
from conf_helpers import GOOD, expect_error, load_error
from singa import device
from singa.errors import ConfigError
from singa.job import config, topology

CONFS = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "confs"
HAS_CUPY = importlib.util.find_spec("cupy") is not None
no_cupy = pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here")


def test_ids_go_to_a_process_workers_in_creation_order_the_rest_on_the_cpu():
    workers = [(0, 0), (0, 1), (1, 0)]
    assert device.of_workers([2, 0], workers, make=False) == {(0, 0): 2, (0, 1): 0, (1, 0): None}
    assert device.of_workers([], workers) == {w: device.CPU for w in workers}
    assert str(device.CPU) == "CPU" and device.CPU.xp is np


def test_host_and_assign_copy_on_the_host():
    a = np.arange(6, dtype=np.float32)
    assert device.host(a) is a and device.is_host(a) and device.module(a) is np
    out = np.zeros((2, 3), np.float32)
    device.assign(out, a.reshape(2, 3) * 2)
    assert out.tolist() == [[0, 2, 4], [6, 8, 10]]


@no_cupy
def test_without_cupy_a_gpu_names_the_extra_to_install():
    with pytest.raises(ConfigError, match=r"needs CuPy, which is not installed: "
                                          r"pip install 'singa\[gpu\]'"):
        device.Device(0)
    device.check([])        # nothing named: nothing imported, nothing to say


@no_cupy
def test_a_conf_with_gpu_fails_at_its_line_without_cupy(tmp_path):
    text = GOOD.replace('name: "t"\n', 'name: "t"\ngpu: 0\n', 1)
    assert "gpu: 0" in text
    expect_error(tmp_path, text, "gpu: 0", "needs CuPy")
    msg, _ = load_error(tmp_path, text)
    assert "singa[gpu]" in msg and "delete the gpu lines to train on the CPU" in msg
    # parsing alone (no check of this machine) accepts it
    assert list(config.load_job(str(tmp_path / "job.conf"), check_paths=False).gpu) == [0]


def test_a_default_stream_per_thread_is_refused_at_the_gpu_line(tmp_path, monkeypatch):
    """A worker's kernels and its servers' updates come from different threads: with CuPy's
    stream per thread nothing would order them."""
    monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    text = GOOD.replace('name: "t"\n', 'name: "t"\ngpu: 0\n', 1)
    expect_error(tmp_path, text, "gpu: 0", "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM set")
    monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "0")
    device.check([])


@pytest.mark.skipif(not HAS_CUPY, reason="CuPy is not installed")
def test_with_cupy_but_no_device_the_check_says_cuda_sees_none():
    cupy = pytest.importorskip("cupy")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:
        count = 0
    if count:
        with pytest.raises(ConfigError, match=r"gpu: 99 is not a GPU of this machine"):
            device.check([0, 99])
    else:
        with pytest.raises(ConfigError, match=r"names a GPU, but CUDA sees none here"):
            device.check([0])


def test_the_partitions_of_a_group_in_one_process_take_a_gpu_each():
    """SINGA's cudnn_hybrid.conf puts the two partitions of one group on GPUs 0 and 1 (it was
    refused while the workers of a process had to share one device)."""
    job = config.load_job(str(CONFS / "cifar10" / "cudnn_hybrid.conf"), check_paths=False,
                          check_layers=False)
    assert list(job.gpu) == [0, 1] and job.cluster.nworkers_per_procs == 2
    assert device.of_workers(job.gpu, [(0, 0), (0, 1)], make=False) == {(0, 0): 0, (0, 1): 1}


@pytest.mark.parametrize("groups", [2**31 - 1, topology.MAX_PROCS])
def test_the_gpu_layout_check_does_no_work_per_process_a_conf_claims(groups):
    """2^31 − 1 worker processes claimed: refused in a moment, as more than a job may run
    (the GPU check looped over every process); the most a job may run: the check looks at
    two."""
    text = (CONFS / "cifar10" / "cudnn.conf").read_text()
    assert "nworker_groups: 1" in text and "gpu: 0" in text
    text = text.replace("nworker_groups: 1", f"nworker_groups: {groups}")
    done = []

    def parse():
        try:
            done.append(config.parse_job(text, "cudnn.conf", check_paths=False,
                                         check_layers=False).cluster.nworker_groups)
        except ConfigError as e:
            done.append(str(e))
    worker = threading.Thread(target=parse, daemon=True)
    worker.start()
    worker.join(10)
    assert done == [groups if groups <= topology.MAX_PROCS else
                    f"cudnn.conf:291: cluster: {groups} processes, more than the "
                    f"{topology.MAX_PROCS} a job may run"]


@pytest.mark.parametrize("device_arg", ["0", [0.5], {"gpu": 0}, True])
def test_the_python_api_refuses_a_device_that_is_no_gpu_id(device_arg, tmp_path):
    from singa.model import Cluster
    with pytest.raises(ConfigError, match="device must list GPU ids"):
        Cluster(str(tmp_path), gpu=device_arg)


NET = """
layer { name: "x" type: kDummy dummy_conf { input: true shape: 8 shape: 1 shape: 6 shape: 6 } }
layer { name: "c" type: kConvolution srclayers: "x" param { name: "w" init { type: kGaussian } }
        param { name: "b" init { type: kConstant } }
        convolution_conf { num_filters: 2 kernel: 3 pad: 1 } }
layer { name: "p" type: kPooling srclayers: "c" pooling_conf { kernel: 2 stride: 2 } }
layer { name: "y" type: kDummy srclayers: "p" dummy_conf { output: true } }
"""

TRAIN_A_STEP = f"""
import sys, numpy as np
import singa.driver, singa.model, singa.train.runtime, singa.api.session, singa.train.worker
from google.protobuf import text_format
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2
conf = text_format.Parse({NET!r}, job_pb2.NetProto())
net = NeuralNet(conf, job_pb2.kTrain, np.random.default_rng(0))
for p in net.params:
    p.init_values(net.rng)
net.forward(job_pb2.kTrain | job_pb2.kForward)
for layer in reversed(net.layers):
    layer.compute_gradient(job_pb2.kTrain | job_pb2.kBackward, net.srclayers[layer.name])
assert np.abs(net.params[0].grad).sum() > 0
print("cupy" in sys.modules)
"""


def test_the_cpu_path_never_imports_cupy():
    """Import what a job runs and train a conv net one step on the CPU: no cupy."""
    r = subprocess.run([sys.executable, "-c", TRAIN_A_STEP], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": singa.HOME})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
