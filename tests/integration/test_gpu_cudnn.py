"""Convolution on cuDNN (singa.layers.kernels.cudnn) as it calls the library, on the CuPy
stand-in with a stand-in libcudnn (fake_cudnn: numpy at the arrays' addresses): every pass
of a net's convolutions within float32 rounding of the CPU's, deterministic algorithms only,
TF32 only where the job asks, a library that computes otherwise left for the im2col path (and
refused when asked for), and the job's check of SINGA_GPU_KERNELS and gpu_tf32 before any
process starts. A real GPU runs the same against real cuDNN in tests/gpu."""
import logging

import numpy as np
import pytest

import fake_cudnn
import strict_device
from singa import device, driver
from singa.errors import ConfigError
from singa.layers import kernels
from singa.layers.kernels import cudnn
from singa.proto import job_pb2
from conftest import FIXTURES, scaled_records
from example_models import final_params
from test_gpu_discipline import convnet, fit, kernel_net_passes


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.delenv("SINGA_GPU_KERNELS", raising=False)
    monkeypatch.setattr(cudnn, "_tf32", [False])
    return strict_device.installed(monkeypatch)


def convolutions(net):
    return [layer for layer in net.layers if layer.conf.type == job_pb2.kConvolution]


def test_a_nets_convolutions_run_on_cudnn_to_the_cpus_values(gpu, monkeypatch):
    """Three convolutions (padded; strided; 4 groups) on cuDNN, beside a deconvolution and
    pooling on our kernels: every blob, gradient and param gradient within float32 rounding of
    the CPU's; each pass ran the deterministic algorithm that the heuristics ranked first
    (never the faster non-deterministic one ranked above it), in float32 (FMA) math."""
    fake = fake_cudnn.installed(monkeypatch)
    cpu, _ = kernel_net_passes(device.CPU, monkeypatch)
    dev, net = kernel_net_passes(device.Device(0), monkeypatch)
    assert all(isinstance(layer.engine, cudnn.Conv) for layer in convolutions(net))
    assert len(cpu) == 26 and dev.keys() == cpu.keys()
    for key, want in cpu.items():       # float32 rounding of the blob's largest value
        assert np.abs(dev[key] - want).max() <= 1e-5 * np.abs(want).max(), key
    ran = set(fake.runs) - {("fwd", 1, 3)}        # the engine's check ran its passes too
    assert ran == {("data", 1, 3), ("filter", 1, 3)}
    assert sum(r[0] == "fwd" for r in fake.runs) == 1 + 3       # the check's, the 3 layers'


def test_a_convnet_trains_on_cudnn_within_rounding_of_the_cpu(tmp_path, gpu, monkeypatch):
    """12 epochs of the Keras API's fit, its steps replayed as CUDA graphs after the first
    (cuDNN's calls captured with the rest): the history and the trained params within float32
    rounding of the CPU's."""
    fake = fake_cudnn.installed(monkeypatch)
    x, y = scaled_records(f"{FIXTURES}/train-1000.bin")
    x, y = x[:400].reshape(-1, 1, 28, 28), y[:400]
    cpu, hist_cpu = fit(convnet, tmp_path / "cpu", x, y)
    dev, hist_dev = fit(convnet, tmp_path / "gpu", x, y, device=[0])
    assert {r[0] for r in fake.runs} == {"fwd", "data", "filter"}
    for key, values in hist_cpu.items():
        assert np.allclose(hist_dev[key], values, rtol=1e-4, atol=1e-6), key
    ours, theirs = final_params(dev), final_params(cpu)
    for name, values in theirs.items():
        assert np.allclose(ours[name], values, rtol=1e-4, atol=1e-6), name
    assert hist_cpu["loss"][-1] < hist_cpu["loss"][0]


def test_tf32_lets_cudnn_choose_tensor_core_algorithms_only_where_the_job_asks(gpu, monkeypatch):
    fake = fake_cudnn.installed(monkeypatch)
    cudnn.allow_tf32(True)
    dev, _ = kernel_net_passes(device.Device(0), monkeypatch)
    layers = [r for r in fake.runs[3:]]         # after the engine's check (float32 always)
    assert fake.runs[:3] == [("fwd", 1, 3), ("data", 1, 3), ("filter", 1, 3)]
    assert {r for r in layers if r[0] == "fwd"} == {("fwd", 6, 1)}     # the tensor-op one
    cudnn.allow_tf32(False)
    fake.runs.clear()
    kernel_net_passes(device.Device(0), monkeypatch)
    assert {r for r in fake.runs if r[0] == "fwd"} == {("fwd", 1, 3)}


def test_a_cudnn_that_computes_otherwise_is_left_for_im2col_and_refused_when_asked(
        gpu, monkeypatch, caplog):
    """A library whose results disagree with numpy's on the engine's small check (here one
    that flips the kernel: convolution for cross-correlation): the GPU's convolutions run
    im2col, said in a warning; with SINGA_GPU_KERNELS=cudnn, a ConfigError."""
    fake_cudnn.installed(monkeypatch, flip=True)
    monkeypatch.setattr(logging.getLogger("singa"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="singa"):
        _, net = kernel_net_passes(device.Device(0), monkeypatch)
    assert all(layer.engine is None for layer in convolutions(net))
    assert "GPU 0: cuDNN's forward differs from numpy's by" in caplog.text
    fake_cudnn.installed(monkeypatch, flip=True)
    monkeypatch.setenv("SINGA_GPU_KERNELS", "cudnn")
    with pytest.raises(ConfigError, match=r"^SINGA_GPU_KERNELS=cudnn: GPU 0: cuDNN's forward "):
        kernel_net_passes(device.Device(0), monkeypatch)


def test_without_cudnn_the_gpu_runs_im2col_and_says_so(gpu, monkeypatch, caplog):
    monkeypatch.setattr(cudnn, "library", lambda: (_ for _ in ()).throw(
        OSError("cuDNN 9 (libcudnn.so.9) is not installed: pip install 'singa[gpu]'")))
    monkeypatch.setattr(kernels, "gpu_engine", kernels.functools.cache(
        kernels.gpu_engine.__wrapped__))
    monkeypatch.setattr(kernels, "_log_engine", kernels.functools.cache(
        kernels._log_engine.__wrapped__))
    monkeypatch.setattr(logging.getLogger("singa"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="singa"):
        _, net = kernel_net_passes(device.Device(0), monkeypatch)
    assert all(layer.engine is None for layer in convolutions(net))
    assert "convolution on a GPU runs im2col + cuBLAS (cuDNN 9 (libcudnn.so.9) is not " \
           "installed" in caplog.text


GPU_JOB = """name: "gpu"
train_steps: 1
neuralnet {
  layer { name: "x" type: kDummy dummy_conf { input: true shape: 2 shape: 3 shape: 8 shape: 8 } }
  layer { name: "c" type: kCConvolution srclayers: "x" param { name: "w" } param { name: "b" }
    convolution_conf { num_filters: 2 kernel: 3 } }
  layer { name: "l" type: kEuclideanLoss srclayers: "c" srclayers: "x2" }
  layer { name: "x2" type: kDummy dummy_conf { input: true shape: 2 shape: 2 shape: 6 shape: 6 } }
}
train_one_batch { alg: kBP }
updater { type: kSGD learning_rate { base_lr: 0.1 type: kFixed } }
cluster { workspace: "ws" }
"""


def check(tmp_path, capsys, text):
    """(exit code, stderr lines) of `singa -check` of job conf `text`, and its path."""
    path = tmp_path / "job.conf"
    path.write_text(text)
    (tmp_path / "conf").mkdir(exist_ok=True)
    (tmp_path / "conf" / "hostfile").write_text("localhost\n")
    (tmp_path / "conf" / "singa.conf").write_text('zookeeper_host: "localhost:1"\n')
    capsys.readouterr()
    rc = driver.main(["-conf", str(path), "-singa_conf", str(tmp_path / "conf" / "singa.conf"),
                      "-check"])
    return rc, capsys.readouterr().err.splitlines(), path


def test_cudnn_asked_for_but_not_installed_is_one_line_before_any_process_starts(
        gpu, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cudnn, "library", lambda: (_ for _ in ()).throw(
        OSError("cuDNN 9 (libcudnn.so.9) is not installed: pip install 'singa[gpu]'")))
    text = GPU_JOB + "gpu: 0\n"
    monkeypatch.setenv("SINGA_GPU_KERNELS", "cudnn")
    rc, err, path = check(tmp_path, capsys, text)
    assert (rc, err) == (2, [f"singa: {path}:{text.count(chr(10))}: SINGA_GPU_KERNELS=cudnn: "
                             f"cuDNN 9 (libcudnn.so.9) is not installed: pip install "
                             f"'singa[gpu]'"])
    monkeypatch.setenv("SINGA_GPU_KERNELS", "cuda")
    got = check(tmp_path, capsys, text)[:2]
    assert got == (0, []), got
    monkeypatch.setenv("SINGA_GPU_KERNELS", "tensorrt")
    rc, err, _ = check(tmp_path, capsys, text)
    assert rc == 2 and err[0].endswith("SINGA_GPU_KERNELS=tensorrt: must be one of cudnn, cuda")
    monkeypatch.setenv("SINGA_GPU_KERNELS", "cudnn")
    assert check(tmp_path, capsys, GPU_JOB)[:2] == (0, [])      # a CPU job: not asked


@pytest.mark.parametrize("cc, refused", [("75", True), ("80", False), ("90", False)])
def test_gpu_tf32_on_a_gpu_without_tf32_tensor_cores_is_one_line_before_any_process_starts(
        gpu, tmp_path, monkeypatch, capsys, cc, refused):
    monkeypatch.setitem(strict_device._cc, 0, cc)
    text = GPU_JOB + "gpu: 0\ngpu_tf32: true\n"
    rc, err, path = check(tmp_path, capsys, text)
    if refused:
        assert (rc, err) == (2, [f"singa: {path}:{text.count(chr(10))}: gpu_tf32: true, but GPU 0 "
                                 f"(compute capability 7.5) has no TF32 tensor cores (8.0 and "
                                 f"later have); delete the line"])
    else:
        assert (rc, err) == (0, [])
