"""The GPU path without a GPU: jobs run with `gpu: 0` on `strict_device`, a CuPy stand-in that
refuses what a GPU cannot do (host arrays mixed into device operations, atomic adds, device
arrays handed to the host's buffer protocol). Its numbers are numpy's, so a job on it must
give a CPU job's bytes wherever the GPU path computes as the CPU path does, and stay within
float32 rounding where it sums in another order (a convolution's gW: the CPU sums it chunk by
chunk, a GPU in one chunk) or computes exp in a kernel (SoftmaxLoss: CUDA's expf, g++'s on
the stand-in, where the CPU has numpy's). Our CUDA kernels (singa/layers/kernels/cuda.py) run on it
through tests/cuda_shim.py. The real GPU is tests/gpu's."""
import importlib.util
import io
import threading
import zlib

import numpy as np
import pytest
import zmq
from google.protobuf import text_format

import singa
import strict_device
from conftest import FIXTURES, scaled_records
from example_models import (BRANCHED_JOB, RESIDUAL_JOB, char_rnn_data, char_rnn_model, conf_model,
                            fed, final_params, fitted, on_cpu_and_gpu)
from singa import device
from singa.comm import msg as m
from singa.comm import param_msg as pm
from singa.comm.socket import Dealer, Peer, Router
from singa.device import cuda_graphs, threads
from singa.job import config
from singa.layers.neuron import DropoutLayer, InnerProductLayer
from singa.model import (SGD, Activation, AvgPooling2D, Cluster, Convolution2D, Dense, Dropout,
                         LRN2D, MaxPooling2D, Model, Sequential)
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2
from singa.train import worker
from singa.train.updater import create_updater


@pytest.fixture
def gpu(monkeypatch):
    return strict_device.installed(monkeypatch)


@pytest.fixture(scope="module")
def mnist():
    x, y = scaled_records(f"{FIXTURES}/train-1000.bin")
    return x[:400], y[:400]


def mlp(ws):
    m = Sequential('mlp')
    m.add(Dense(32, init='uniform', activation='relu'))
    m.add(Dropout(0.2))
    m.add(Dense(10, init='uniform', activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.05, momentum=0.9),
              cluster=Cluster(str(ws)))
    return m


def convnet(ws):
    m = Sequential('conv')
    m.add(Convolution2D(4, kernel=3, pad=1, activation='relu'))
    m.add(MaxPooling2D(pool_size=2, stride=2))
    m.add(LRN2D(3))
    m.add(Convolution2D(6, kernel=3, stride=2))
    m.add(Activation('relu'))
    m.add(AvgPooling2D(pool_size=3, stride=2))
    m.add(Dense(10, activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.02, momentum=0.9),
              cluster=Cluster(str(ws)))
    return m


def fit(make, ws, x, y, **kw):
    m = make(ws)
    h = m.fit(x, y, nb_epoch=12, batch_size=40, validation_data=(x[:100], y[:100]), seed=5,
              progress=False, **kw)
    return m, h.history


def test_an_mlp_with_dropout_trains_on_the_gpu_path_to_the_cpus_values(tmp_path, mnist, gpu):
    """The same dropout masks and updates; SoftmaxLoss's exp rounds apart."""
    cpu, hist_cpu = fit(mlp, tmp_path / "cpu", *mnist)
    dev, hist_dev = fit(mlp, tmp_path / "gpu", *mnist, device=[0])
    assert rounding_apart(hist_dev, hist_cpu)
    assert rounding_apart(final_params(dev), final_params(cpu))
    x, y = mnist
    assert rounding_apart(dev.evaluate(x, y, device=[0], verbose=0), cpu.evaluate(x, y, verbose=0))
    assert rounding_apart(dev.predict(x[:50], device=[0]), cpu.predict(x[:50]))


def test_a_step_of_a_one_process_gpu_job_moves_only_its_batch_and_never_waits_for_itself(
        tmp_path, mnist, gpu, monkeypatch):
    """No param value or gradient crosses between host and device in a step: the servers
    update the workers' params where they are. Per step only the batch (and its labels) goes
    to the device, and only the loss comes back (before: every gradient came up and every
    value went down, 101,800 bytes each way). The host never waits for the work it has just
    queued: the batch, its labels and the dropout mask go through pinned buffers, the
    metrics stay on the device until displayed (before: 6 waits a step), and the loss is
    copied without waiting and looked at once the next step is queued (before: a wait a step).
    The worker sends the step's gradients in one Update, whatever a CPU worker's bucket would
    hold."""
    x, y = mnist
    moved, waits, lags, ops, buckets, updates = [], [], [], [], [], []
    update = pm.update
    monkeypatch.setattr(pm, "update", lambda *a: (buckets.append(a[3]), update(*a))[1])
    monkeypatch.setattr(worker, "BUCKET_FLOATS", 1)
    for steps in (10, 20):
        m = Sequential('mlp')
        m.add(Dense(32, init='uniform', activation='tanh'))
        m.add(Dropout(0.2))
        m.add(Dense(10, init='uniform', activation='softmax'))
        m.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.05, momentum=0.9),
                  cluster=Cluster(str(tmp_path / str(steps))))
        gpu.moved.clear()
        gpu.waits.clear()
        gpu.event_waits.clear()
        buckets.clear()
        before = gpu.queued[0]
        m.fit(x, y, nb_epoch=steps, batch_size=40, seed=5, progress=False, device=[0],
              disp_freq=100)
        ops.append(gpu.queued[0] - before)
        moved.append(dict(gpu.moved))
        waits.append(sum(gpu.waits.values()))
        lags.append(list(gpu.event_waits))
        updates.append(len(buckets))
    per_step = {k: (moved[1][k] - moved[0][k]) / 10 for k in moved[0]}
    assert per_step["to host"] == 16        # the loss's and the accuracy's sums (float64)
    mask = 40 * 32 * 4
    assert 40 * x[0].nbytes + mask <= per_step["to device"] <= 40 * (x[0].nbytes + 8) + mask
    assert waits[1] == waits[0]
    # the loss of step s and the uploads for it are waited for once step s + 1 is queued;
    # only at the start and the end the host waits for all it has queued
    assert (len(lags[1]) - len(lags[0])) / 10 == 4
    step_ops = (ops[1] - ops[0]) / 10
    assert [sum(lag < step_ops / 2 for lag in run) for run in lags] == [2, 2]
    assert (updates[1] - updates[0]) / 10 == 1 and {len(b) for b in buckets} == {4}


@pytest.mark.parametrize("conf", [
    "type: kSGD momentum: 0.9 weight_decay: 0.01 clip_low: -0.1 clip_high: 0.1",
    "type: kNesterov momentum: 0.9", "type: kAdaGrad delta: 1e-6",
    "type: kRMSProp delta: 1e-6 rmsprop_conf { rho: 0.95 }",
    "type: kAdaDelta delta: 1e-6 adadelta_conf { rho: 0.9 }", "type: kAdam delta: 1e-6",
    "type: kAdamMax delta: 1e-6 adammax_conf { beta1: 0.8 beta2: 0.99 }"])
def test_every_updater_runs_on_the_device_to_the_host_bytes(gpu, conf):
    """A server updates a slice on its worker's GPU: each rule, with weight decay and scales,
    computes there as on the host."""
    proto = text_format.Parse(f"{conf} learning_rate {{ type: kFixed base_lr: 0.1 }}",
                              job_pb2.UpdaterProto())
    rng = np.random.default_rng(3)
    w = rng.normal(0, 1, 91).astype(np.float32)
    runs = []
    for xp in (np, gpu):
        up = create_updater(proto)
        data, state = xp.asarray(w.copy()), up.new_state(w.shape, xp)
        for step, g in enumerate(np.random.default_rng(4).normal(0, 0.3, (4, 91))):
            up.update(step, data, xp.asarray(g.astype(np.float32)), state, lr_scale=2.0,
                      wd_scale=3.0, grad_scale=0.5)
        runs.append(device.host(data).tobytes())
    assert runs[0] == runs[1]


@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_a_gpu_array_is_handed_over_in_process_and_its_values_go_to_another(gpu, transport):
    """In-process a message carries the GPU array itself, whatever its size; to another process
    its values, copied to the host."""
    ctx = zmq.Context()
    router = Router(ctx, "inproc://test-device" if transport == "inproc" else "tcp://127.0.0.1:*")
    src = m.addr(0, 0, m.kWorkerParam)
    d = Dealer(src, router.endpoint) if transport == "inproc" else \
        Peer(ctx, router.endpoint)
    a = gpu.arange(3, dtype=np.float32)
    d.send(m.Msg(src, 1, m.kUpdate, frames=[m.array_frame(a)]))
    view = m.frame_array(router.receive(2000).frames[0], 3)
    assert device.is_host(view) == (transport == "tcp")
    assert m.same_memory(view, a) == (transport == "inproc")
    np.testing.assert_array_equal(device.host(view), [0, 1, 2])
    d.close(), router.close(), ctx.term()


def test_a_gpu_snapshot_continues_on_the_cpu_as_one_run(tmp_path, mnist, gpu):
    """fit 12 steps on the GPU path, then 12 more on the CPU: 24 on the CPU, to rounding."""
    x, y = mnist
    m = mlp(tmp_path / "mixed")
    m.fit(x, y, nb_epoch=12, batch_size=40, seed=5, progress=False, device=[0])
    m.fit(x, y, nb_epoch=12, batch_size=40, seed=5, progress=False)
    whole = mlp(tmp_path / "whole")
    whole.fit(x, y, nb_epoch=24, batch_size=40, seed=5, progress=False)
    assert rounding_apart(final_params(m), final_params(whole))


def test_a_convnet_trains_on_the_gpu_path_within_rounding_of_the_cpu(tmp_path, mnist, gpu):
    """Convolution (padded and strided), MAX and AVG pooling, LRN, ReLU: the CPU sums a
    convolution's gW chunk by chunk, a GPU in one chunk, so the runs agree to float32
    rounding."""
    x, y = mnist
    x = x.reshape(-1, 1, 28, 28)
    cpu, hist_cpu = fit(convnet, tmp_path / "cpu", x, y)
    dev, hist_dev = fit(convnet, tmp_path / "gpu", x, y, device=[0])
    for key, values in hist_cpu.items():
        assert np.allclose(hist_dev[key], values, rtol=1e-4, atol=1e-6), key
    ours, theirs = final_params(dev), final_params(cpu)
    for name, values in theirs.items():
        assert np.allclose(ours[name], values, rtol=1e-4, atol=1e-6), name
    assert hist_cpu["loss"][-1] < hist_cpu["loss"][0]


KERNEL_NET = """
layer { name: "x" type: kDummy dummy_conf { input: true shape: 4 shape: 3 shape: 11 shape: 11 } }
layer { name: "t" type: kDummy dummy_conf { input: true shape: 4 shape: 4 shape: 3 shape: 3 } }
layer { name: "c1" type: kConvolution srclayers: "x" param { name: "w1" } param { name: "b1" }
  convolution_conf { num_filters: 4 kernel: 3 pad: 1 } }
layer { name: "p1" type: kPooling srclayers: "c1"
  pooling_conf { pool: MAX kernel: 3 stride: 2 pad: 1 ceil_mode: true } }
layer { name: "c2" type: kConvolution srclayers: "p1" param { name: "w2" } param { name: "b2" }
  convolution_conf { num_filters: 6 kernel: 3 stride: 2 pad: 1 } }
layer { name: "d" type: kDeconvolution srclayers: "c2" param { name: "w3" } param { name: "b3" }
  convolution_conf { num_filters: 4 kernel: 3 stride: 2 pad: 1 } }
layer { name: "c3" type: kConvolution srclayers: "d" param { name: "w4" } param { name: "b4" }
  convolution_conf { num_filters: 4 kernel: 3 pad: 1 group: 4 } }
layer { name: "p2" type: kCudnnPool srclayers: "c3"
  pooling_conf { pool: AVG kernel: 2 stride: 1 pad: 1 } }
layer { name: "p3" type: kPooling srclayers: "p2"
  pooling_conf { pool: AVG kernel: 3 stride: 2 ceil_mode: true } }
layer { name: "loss" type: kEuclideanLoss srclayers: "p3" srclayers: "t" }
"""


def test_convolution_and_pooling_kernels_give_the_cpus_bytes_on_the_gpu_path(gpu, monkeypatch):
    """Each of our CUDA kernels in a net (im2col and col2im, the transposed convolution's
    im2col, deconvolution, a depthwise convolution's direct loops, MAX and AVG pooling with
    padding and ceil mode) against numba's loops (the im2col path: oneDNN's convolution adds
    in its own order): with the CPU's batch in one chunk, as a GPU's, every blob and gradient
    has the CPU's bytes."""
    monkeypatch.setenv("SINGA_KERNELS", "numba")
    out = [{k: v.tobytes() for k, v in kernel_net_passes(place, monkeypatch)[0].items()}
           for place in (device.CPU, device.Device(0))]
    assert len(out[0]) == 26 and out[1] == out[0]


def kernel_net_passes(place, monkeypatch):
    """({blob, gradient or param gradient: host copy}, the net) of a forward and a backward
    pass of KERNEL_NET on `place`, its batch in one chunk as a GPU's, params and inputs drawn
    from their names."""
    monkeypatch.setattr(threads, "chunks", lambda n, *args: [slice(0, n)])
    net = NeuralNet(text_format.Parse(KERNEL_NET, job_pb2.NetProto()), job_pb2.kTrain,
                    np.random.default_rng(0), device=place)
    for p in net.params:
        rng = np.random.default_rng(zlib.crc32(p.name.encode()))
        p.data[...] = place.put(0.3 * rng.standard_normal(p.data.shape, np.float32))
    for layer in net.layers:
        if layer.conf.type == job_pb2.kDummy:
            rng = np.random.default_rng(zlib.crc32(layer.name.encode()))
            layer.feed(rng.standard_normal(layer.data.shape, np.float32))
    net.forward(job_pb2.kTrain | job_pb2.kForward)
    for layer in reversed(net.layers):
        layer.compute_gradient(job_pb2.kTrain | job_pb2.kBackward, net.srclayers[layer.name])
    out = {f"{layer.name}.{what}": device.host(getattr(layer, what))
           for layer in net.layers for what in ("data", "grad")
           if hasattr(getattr(layer, what, None), "shape")}
    return out | {p.name: device.host(p.grad) for p in net.params}, net


def rounding_apart(a, b, rtol=1e-5):
    """a and b, dicts of arrays or lists of numbers (or numbers), agree to float32 rounding:
    not bit for bit (SoftmaxLoss's exp, see above), but no plumbing mistake comes this close."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(rounding_apart(a[k], b[k], rtol) for k in a)
    if not np.allclose(a, b, rtol=rtol, atol=1e-7):
        raise AssertionError(f"apart by {np.abs(np.subtract(a, b)).max()}")
    return True


@pytest.mark.skipif(not all(map(importlib.util.find_spec, ("lmdb", "PIL"))),
                    reason="needs lmdb and Pillow")
def test_a_caffe_lmdb_of_images_feeds_the_gpu_path_its_bytes_and_the_cpus_crops(
        tmp_path, gpu, monkeypatch):
    """Caffe's LMDB of PNG and JPEG Datums (FED_JOB), cropped, mirrored and scaled by
    ImagePreprocess, which computes on the GPU: per step the images go to the device as
    their bytes, 3 × 189, with their labels and the crops' offsets (before: 3,180 bytes, the
    images and their crops as floats), and each step's crops are the CPU's, to the bit (the
    same records, offsets and flips); training is the CPU's within SoftmaxLoss's rounding."""
    runs, moved = {}, []
    for name, dev, steps in (("cpu", None, 8), ("gpu", [0], 8), ("gpu 4", [0], 4)):
        gpu.moved.clear()
        runs[name] = fed(tmp_path, name, monkeypatch, steps, dev)
        moved.append(gpu.moved["to device"])
    crops = {name: [c.tobytes() for c in run[0]] for name, run in runs.items()}
    assert len(crops["cpu"]) == len(set(crops["cpu"])) == 8
    assert crops["gpu"] == crops["cpu"]
    assert rounding_apart(runs["gpu"][1], runs["cpu"][1])
    assert rounding_apart(runs["gpu"][2], runs["cpu"][2])
    assert (moved[1] - moved[2]) / 4 == 3 * 189 + 3 * 4 + 3 * 3 * 4


def test_an_rbm_trains_with_cd_on_the_gpu_path_as_on_the_cpu(tmp_path, gpu):
    """kCD: RBMVis/RBMHid's Gibbs sampling draws its numbers on the host, so both paths draw
    the same samples; the CPU cuts its products into pieces for its threads, a GPU makes one
    (the same sums, BLAS blocks them differently: rounding apart)."""
    data = {"examples/mnist/train_data.bin": f"{FIXTURES}/train-1000.bin",
            "examples/mnist/test_data.bin": f"{FIXTURES}/test-500.bin"}
    runs = on_cpu_and_gpu(lambda name: conf_model(tmp_path, name,
                                                  f"{singa.HOME}/examples/rbm/rbm1.conf", data),
                          nb_epoch=8, test_steps=2, test_freq=4, disp_freq=4, seed=7)
    for name, values in runs["cpu"].items():
        assert np.allclose(runs["gpu"][name], values, rtol=1e-5, atol=1e-6), name


def test_char_rnn_trains_with_bptt_on_the_gpu_path_to_the_cpus_values(tmp_path, gpu):
    """kBPTT: CharRNN and OneHot compute on the host, the unrolled GRUs on the device."""
    char_rnn_data(tmp_path)
    runs = on_cpu_and_gpu(lambda name: char_rnn_model(tmp_path, name), nb_epoch=6,
                          disp_freq=3, seed=7)
    assert rounding_apart(runs["gpu"], runs["cpu"])


@pytest.mark.parametrize("layout", [
    {"nworkers_per_group": 2, "nworkers_per_procs": 2},         # Sandblaster: a group of 2
    {"nworker_groups": 2, "nworkers_per_procs": 2, "share_memory": True},    # Downpour
])
def test_several_workers_of_a_process_share_one_gpu(tmp_path, mnist, gpu, layout):
    """gpu: [0, 0]: the workers of one process (partitions of a group, or groups sharing
    memory) on one GPU train as on the CPU."""
    runs = {}
    for name, device in (("cpu", None), ("gpu", [0, 0])):
        m = Sequential('mlp')
        m.add(Dense(32, init='uniform', activation='relu'))
        m.add(Dense(10, init='uniform', activation='softmax'))
        m.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.05),
                  cluster=Cluster(str(tmp_path / name), **layout))
        h = m.fit(*mnist, nb_epoch=10, batch_size=40, seed=2, progress=False, device=device)
        runs[name] = h.history
    if "nworker_groups" in layout:      # asynchronous: the order of updates varies
        assert runs["gpu"]["loss"][-1] < runs["gpu"]["loss"][0]
    else:
        assert rounding_apart(runs["gpu"], runs["cpu"])


def cifar_conf(tmp_path):
    """SINGA's cudnn_bm.conf (kCudnnConv/Pool/Activation/LRN/BM, kCudnnSoftmax in its test net)
    on generated CIFAR shards, batch cut to 10, its gpu line dropped (device= gives it)."""
    from test_cifar10 import create_data, write_cifar_batches
    write_cifar_batches(tmp_path, per_batch=20)
    create_data.create_data(str(tmp_path), str(tmp_path), log=io.StringIO())
    with open(f"{singa.HOME}/tests/fixtures/confs/cifar10/cudnn_bm.conf") as f:
        return (f.read().replace("examples/cifar10/", f"{tmp_path}/")
                .replace("batchsize: 100", "batchsize: 10").replace("\ngpu: 0\n", "\n"))


def test_cifar10_cudnn_bm_layers_agree_with_the_cpu_to_rounding_on_the_gpu_path(tmp_path, gpu):
    """One forward and backward pass with the same params: each blob (an input layer's: its
    GPU copy, decoded there) and param gradient on device 0 within 1e-5 of its largest value
    on the CPU (the CPU sums a convolution's products chunk by chunk, a GPU in one product),
    or 1e-6 for the gradient of a bias before batch normalisation, which is rounding noise
    around 0."""
    job = config.parse_job(cifar_conf(tmp_path), "cudnn_bm.conf", check_paths=False)
    nets = []
    for place in (device.CPU, device.Device(0)):
        net = NeuralNet(job.neuralnet, job_pb2.kTrain, np.random.default_rng(0), device=place)
        for p in net.params:
            p.init_values(np.random.default_rng(1))
        net.forward(job_pb2.kTrain | job_pb2.kForward)
        for layer in reversed(net.layers):
            layer.compute_gradient(job_pb2.kTrain | job_pb2.kBackward, net.srclayers[layer.name])
        nets.append(net)
    cpu, dev = nets
    assert not device.is_host(dev.params[0].data)
    for a, b in zip(cpu.layers, dev.layers):
        pairs = [(a.name, a.data, b.data if b.mirror is None else b.mirror)] \
            if hasattr(a.data, "shape") else []
        pairs += [(p.name, p.grad, q.grad) for p, q in zip(a.params, b.params)]
        for name, ours, theirs in pairs:
            assert np.abs(device.host(theirs) - ours).max() <= 1e-5 * np.abs(ours).max() + 1e-6, \
                name


def test_cifar10_cudnn_bm_conf_trains_on_the_gpu_path_as_on_the_cpu(tmp_path, gpu):
    """Four steps of training and two tests: the losses within 1e-4 of the CPU run's."""
    (tmp_path / "job.conf").write_text(cifar_conf(tmp_path))
    runs = {}
    for name, place in (("cpu", None), ("gpu", [0])):
        m = Model.from_conf(str(tmp_path / "job.conf"))
        m.jobconf.cluster.workspace = str(tmp_path / name)
        runs[name] = m.fit(nb_epoch=4, test_steps=2, test_freq=2, disp_freq=2, seed=3,
                           progress=False, device=place).history
    assert runs["gpu"].keys() == runs["cpu"].keys()
    for key, values in runs["cpu"].items():
        assert np.allclose(runs["gpu"][key], values, rtol=1e-4), key


@pytest.mark.parametrize("gpus", [[0, 1], [1, 0], [0]])
def test_cifar10_cudnn_hybrid_conf_trains_with_its_partitions_on_two_devices(tmp_path,
                                                                             monkeypatch, gpus):
    """SINGA's cudnn_hybrid.conf (two workers of a group in one process: the convolutions
    on dim 0, ip1 on dim 1) with its partitions on GPUs 0 and 1 (or 1 and 0; or GPU 0 and the
    CPU, SINGA's rule for a worker beyond the ids): the bridges' blobs and the params' values
    and gradients cross between the devices, and the metrics stay within 1e-6 of the CPU's
    (the first test's loss was 4.6e-6 off where a copy on the other device took the Put's
    version without its values)."""
    strict_device.installed(monkeypatch, gpus=2)
    from test_cifar10 import create_data, write_cifar_batches
    write_cifar_batches(tmp_path, per_batch=20)
    create_data.create_data(str(tmp_path), str(tmp_path), log=io.StringIO())
    with open(f"{singa.HOME}/tests/fixtures/confs/cifar10/cudnn_hybrid.conf") as f:
        text = (f.read().replace("examples/cifar10/", f"{tmp_path}/")
                .replace("batchsize: 100", "batchsize: 10").replace("\ngpu: 0\ngpu: 1\n", "\n"))
    (tmp_path / "job.conf").write_text(text)
    runs = {}
    for name, place in (("cpu", None), ("gpu", gpus)):
        m = Model.from_conf(str(tmp_path / "job.conf"))
        m.jobconf.cluster.workspace = str(tmp_path / name)
        strict_device.moved.clear()
        runs[name] = m.fit(nb_epoch=4, test_steps=2, test_freq=2, disp_freq=2, seed=3,
                           progress=False, device=place).history
    assert strict_device.moved["between devices"] > 0 if len(gpus) == 2 else \
        strict_device.moved["to host"] > 0
    assert runs["gpu"].keys() == runs["cpu"].keys() and len(runs["cpu"]["loss"]) == 2
    for key, values in runs["cpu"].items():
        assert np.allclose(runs["gpu"][key], values, rtol=0, atol=1e-6), key


def test_an_input_layer_decodes_its_pixels_on_the_device_to_the_hosts_bytes(tmp_path, gpu):
    """cifar10's records with a mean file and a std: on the GPU path the batch goes up as its
    pixel bytes and the device computes (x − mean) / std, the CPU's float32 bits, batch after
    batch across the end of the shard, while the next batch is read ahead: the position is
    still that of the batches used, a seek (a resume) forgets the batch read ahead, and
    closing ends the reading thread."""
    text = cifar_conf(tmp_path).replace("mean_file:", "std_value: 3.3\n      mean_file:", 1)
    job = config.parse_job(text, "cudnn_bm.conf", check_paths=False)
    cpu, dev = (NeuralNet(job.neuralnet, job_pb2.kTrain, np.random.default_rng(0),
                          device=place).layers[0] for place in (device.CPU, device.Device(0)))
    assert dev.on_device[0].dtype == np.uint8 and cpu.std is not None and cpu.mean.shape != ()
    positions = set()
    for step in range(20):
        if step == 9:
            for layer in (cpu, dev):
                layer.seek(*positions_at_3)
        for layer in (cpu, dev):
            layer.compute_feature(job_pb2.kTrain, [])
        assert dev._ahead is not None and dev.position() == cpu.position()
        assert device.host(dev.mirror).tobytes() == cpu.data.tobytes()
        assert device.host(dev.aux_mirror).tobytes() == cpu.aux_data.tobytes()
        assert dev.aux_data.tobytes() == cpu.aux_data.tobytes()
        positions.add(cpu.position())
        if step == 3:
            positions_at_3 = cpu.position()
    # 10 batches of 10 in the shard: it wrapped around
    assert len(positions) == 10 and cpu.position() < max(positions)
    reader = [t for t in threading.enumerate() if t.name.startswith(f"read {dev.name}")]
    dev.close()     # its net is done: the reading thread ends, the store is closed
    assert reader and not any(t.is_alive() for t in reader) and dev.store is None


def errors_of(tmp_path, conf, error):
    """{"cpu" | "gpu": the message of the `error` that stops `conf` fitted 20 steps there}."""
    errors = {}
    for name, device in (("cpu", None), ("gpu", [0])):
        m = conf_model(tmp_path, name, str(conf), {})
        with pytest.raises(error) as e:
            m.fit(nb_epoch=20, disp_freq=0, seed=1, progress=False, device=device)
        errors[name] = str(e.value)
    return errors


def test_a_nan_loss_on_the_gpu_path_names_its_step_once_the_next_is_queued(tmp_path, gpu,
                                                                          nan_csv_job):
    """The GPU's loss is looked at after the next step is queued: the error names the step
    whose loss is nan, as on the CPU, and where the values are bad by the step after."""
    errors = errors_of(tmp_path, nan_csv_job, singa.errors.NonFiniteError)
    assert errors["cpu"] == ("step 6: the loss of layer '0#loss' is nan; the first non-finite "
                             "values are in the output of layer '0#data'")
    assert errors["gpu"] == ("step 6: the loss of layer '0#loss' is nan; by step 7, the first "
                             "non-finite values are in param '0#w' of layer '0#ip'")


def fit_graphs_and_op_by_op(make, tmp_path, x, y, gpu, monkeypatch):
    """{"graphs" | "op by op": (history, final params, device operations queued, graph
    launches)} of `make`'s model fitted 12 steps on the GPU path with its passes as CUDA
    graphs, and without."""
    runs, launches = {}, []
    launch = gpu.Graph.launch
    monkeypatch.setattr(gpu.Graph, "launch", lambda *a: (launches.append(1), launch(*a))[1])
    for name, warmup in (("graphs", cuda_graphs.WARMUP), ("op by op", 10 ** 9)):
        monkeypatch.setattr(cuda_graphs, "WARMUP", warmup)
        before = gpu.queued[0]
        launches.clear()
        m, hist = fit(make, tmp_path / name, x, y, device=[0])
        runs[name] = (hist, final_params(m), gpu.queued[0] - before, len(launches))
    return runs


def same_bytes(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("make, graphs", [(mlp, 3), (convnet, 1)])
def test_a_gpu_step_replays_runs_of_passes_as_cuda_graphs_to_the_bytes_op_by_op(
        tmp_path, mnist, gpu, monkeypatch, make, graphs):
    """Runs of capturable layers' passes (InnerProduct, ReLU, SoftmaxLoss; Convolution,
    Pooling, LRN) are captured after WARMUP steps and then launched as one graph each a step
    (the MLP: its Dropout's draws split them in 3; the convnet: all its passes but the input
    layer's); the input layer runs op by op before them, and SoftmaxLoss's host work (its
    labels' check, its count of batches) before each launch. On the stand-in a capture
    computes nothing and a launch replays only the device operations recorded, as on a GPU:
    the same bytes and metrics as op by op, in fewer device operations (a launch is one)."""
    x, y = mnist
    if make is convnet:
        x = x.reshape(-1, 1, 28, 28)
    warmup = cuda_graphs.WARMUP
    runs = fit_graphs_and_op_by_op(make, tmp_path, x, y, gpu, monkeypatch)
    (hist, params, ops, launches), (hist_ops, params_ops, ops_ops, _) = \
        runs["graphs"], runs["op by op"]
    assert hist == hist_ops and same_bytes(params, params_ops)
    assert launches == graphs * (12 - warmup) and ops < ops_ops


def test_a_label_out_of_range_stops_a_gpu_job_whose_loss_runs_in_a_graph(tmp_path, gpu,
                                                                          nan_csv_job):
    """SoftmaxLoss's labels are checked on the host before each launch of its graph: a label
    out of range at step 6 stops the job there, with the CPU's error."""
    data = tmp_path / "data.csv"
    lines = data.read_text().splitlines()
    lines[25] = "5," + lines[25].partition(",")[2].replace("nan", "0")
    data.write_text("\n".join(lines) + "\n")
    errors = errors_of(tmp_path, nan_csv_job, singa.errors.DataError)
    assert errors["gpu"] == errors["cpu"] == (
        "layer '0#loss': label 5 from source '0#data' is outside [0, 2)")


AUTOENCODER_JOB = """name: "autoencoder"
train_one_batch { alg: kBP }
updater { type: kAdaGrad delta: 1e-6 learning_rate { type: kFixed base_lr: 0.05 } }
neuralnet {
  layer { name: "data" type: kRecordInput
    store_conf { backend: "kvfile" path: "DATA" batchsize: 20 std_value: 255 shape: 784 } }
  layer { name: "encode" type: kInnerProduct srclayers: "data" innerproduct_conf { num_output: 32 }
    param { name: "w1" init { type: kGaussian std: 0.05 } }
    param { name: "b1" init { type: kConstant value: 0 } } }
  layer { name: "code" type: kSigmoid srclayers: "encode" }
  layer { name: "decode" type: kInnerProduct srclayers: "code" innerproduct_conf { num_output: 784 }
    param { name: "w2" init { type: kGaussian std: 0.05 } }
    param { name: "b2" init { type: kConstant value: 0 } } }
  layer { name: "out" type: kSigmoid srclayers: "decode" }
  layer { name: "loss" type: kEuclideanLoss srclayers: "out" srclayers: "data" }
}
cluster { workspace: "WS" }
"""


@pytest.mark.parametrize("job", [BRANCHED_JOB, AUTOENCODER_JOB, RESIDUAL_JOB],
                         ids=["branched", "autoencoder", "residual"])
def test_confs_replay_their_passes_as_one_cuda_graph_to_the_bytes_op_by_op(
        tmp_path, gpu, monkeypatch, job):
    """A net of two branches (Split, Concate) with batch normalisation (kCudnnBM), an
    autoencoder whose EuclideanLoss sums its loss on the device, and a residual block as the
    model zoo's ResNets have it (Caffe's BatchNorm updating its running sums, Scale, Eltwise;
    Crop and Flatten): all passes but the input layer's are one graph, with the same params
    (the running sums too) and losses as op by op."""
    launches, runs = [], {}
    launch = gpu.Graph.launch
    monkeypatch.setattr(gpu.Graph, "launch", lambda *a: (launches.append(1), launch(*a))[1])
    for name, warmup in (("graphs", cuda_graphs.WARMUP), ("op by op", 10 ** 9)):
        monkeypatch.setattr(cuda_graphs, "WARMUP", warmup)
        runs[name] = fitted(tmp_path, name.replace(" ", "-"), job, device=[0])
    assert runs["graphs"][0] == runs["op by op"][0]
    assert same_bytes(runs["graphs"][1], runs["op by op"][1])
    assert len(launches) == 8 - 2


def test_a_pass_declared_capturable_wrongly_shows_on_the_stand_in(tmp_path, mnist, gpu,
                                                                   monkeypatch):
    """Dropout draws its mask on the host in its pass: declared capturable, each launch
    replays the mask of the capture, and training goes elsewhere than op by op."""
    monkeypatch.setattr(DropoutLayer, "capturable", True, raising=False)
    runs = fit_graphs_and_op_by_op(mlp, tmp_path, *mnist, gpu, monkeypatch)
    assert not same_bytes(runs["graphs"][1], runs["op by op"][1])


def test_passes_a_capture_cannot_hold_run_op_by_op_with_a_warning(tmp_path, mnist, gpu,
                                                                  monkeypatch):
    """A pass that reads a device value on the host (a capture computes nothing) makes the
    capture fail: one warning, and the step runs op by op, to the same bytes."""
    forward = InnerProductLayer.compute_feature

    def reading(self, flag, srclayers):
        forward(self, flag, srclayers)
        float(self.data[0, 0])
    monkeypatch.setattr(InnerProductLayer, "compute_feature", reading)
    warnings = []
    monkeypatch.setattr(cuda_graphs.log, "warning", lambda text, *a: warnings.append(text % a))
    runs = fit_graphs_and_op_by_op(mlp, tmp_path, *mnist, gpu, monkeypatch)
    assert same_bytes(runs["graphs"][1], runs["op by op"][1])
    assert warnings == [
        "the passes of layers 0#layer1, 0#relu1 could not be captured as a CUDA graph "
        "(StrictError: a device value read on the host while a stream is capturing (the GPU "
        "computes nothing then)); the step runs op by op"]


def test_a_graph_is_captured_again_when_an_array_of_its_passes_is_replaced(
        tmp_path, mnist, gpu, monkeypatch):
    """The last InnerProduct's gradient blob replaced mid-training (the loss writes into the
    new one): the graphs of its passes are captured again, and training gives op by op's
    bytes."""
    train, captured, replaced = worker.Worker.train_one_batch, [], []

    def replacing(self, step):
        if step == 5:
            ip = [layer for layer in self.train_net.layers
                  if isinstance(layer, InnerProductLayer)][-1]
            ip.grad = self.device.xp.zeros_like(ip.grad)
            replaced.append(ip)
        train(self, step)
    monkeypatch.setattr(worker.Worker, "train_one_batch", replacing)
    capture = cuda_graphs.StepGraphs._captured
    monkeypatch.setattr(cuda_graphs.StepGraphs, "_captured",
                        lambda self, segment: (captured.append(segment), capture(self, segment))[1])
    runs = fit_graphs_and_op_by_op(mlp, tmp_path, *mnist, gpu, monkeypatch)
    assert same_bytes(runs["graphs"][1], runs["op by op"][1])
    again = [s for s in captured if captured.count(s) == 2]
    assert again and all(any(layer is replaced[0] for layer, _ in s.passes) for s in again)


def test_caffe_batch_norm_on_its_global_statistics_never_waits_for_the_gpu(gpu):
    """kCaffeBatchNorm by the running sums (a test pass) scales them by 1/s on the device:
    it read s on the host, a wait for the GPU per layer and pass; the CPU's values within
    float32 rounding, and 0 for s = 0 as Caffe's."""
    conf = text_format.Parse("""
        layer { name: "x" type: kDummy dummy_conf { input: true shape: 4 shape: 3 shape: 5 shape: 5 } }
        layer { name: "bn" type: kCaffeBatchNorm srclayers: "x"
                param { name: "m" } param { name: "v" } param { name: "f" } }""",
                             job_pb2.NetProto())
    x = np.random.default_rng(0).standard_normal((4, 3, 5, 5)).astype(np.float32)
    outs = {}
    for factor in (2.5, 0.0):
        for place in (device.CPU, device.Device(0)):
            net = NeuralNet(conf, job_pb2.kTest, np.random.default_rng(0), device=place)
            bn = net.layers[1]
            for p, values in zip(bn.params, ([0.4, -1.0, 2.0], [2.0, 0.5, 3.0], [factor])):
                device.assign(p.data, np.array(values, np.float32))
            net.layers[0].feed(x)
            reads = strict_device.waits["read"]
            net.forward(job_pb2.kTest | job_pb2.kForward)
            if place is not device.CPU:
                assert strict_device.waits["read"] == reads
            outs[factor, place.gpu] = device.host(bn.data)
        np.testing.assert_allclose(outs[factor, 0], outs[factor, None], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(outs[0.0, 0], x / np.sqrt(np.float32(1e-5)), rtol=1e-6)
