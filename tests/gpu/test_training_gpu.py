"""Training on GPU 0 against the CPU: SINGA's MNIST MLP, LeNet and cifar10 confs reach the CPU
run's test accuracy within one point at the same step, and train with their passes as CUDA
graphs to the bits of op by op; an RBM (kCD) and char-rnn (kBPTT) train as on the CPU; a
GPU job resumed on the GPU continues bit-exactly; a Caffe LMDB of images feeds the GPU the
CPU's crops; snapshots move between the GPU and the
CPU; two workers share one GPU, and two GPUs hold a group's partitions; a job of two
processes over tcp (no ZooKeeper) has its worker process on the GPU and its server process on
the CPU."""
import multiprocessing as mp
import os

import numpy as np
import pytest

import singa
from example_models import (EXAMPLES, char_rnn_data, char_rnn_model, conf_model, fed,
                            final_params, on_cpu_and_gpu)
from singa import checkpoint
from singa.device import cuda_graphs, threads
from singa.job import topology
from singa.model import (SGD, Cluster, Convolution2D, Dense, MaxPooling2D, Sequential)
from singa.train.place import Place
from singa.train.runtime import Process, Transport

FIX = os.path.join(singa.HOME, "tests", "fixtures", "singa-0.3")
STANDIN = os.environ.get("SINGA_GPU_STANDIN", "0") != "0"     # tests/gpu/conftest.py
MNIST = {"examples/mnist/train_data.bin": f"{FIX}/train-1000.bin",
         "examples/mnist/test_data.bin": f"{FIX}/test-500.bin"}


def write_cifar(folder, per_batch=200, per_test=1000, seed=0):
    """CIFAR-10 binary batches whose classes differ in colour under so much noise that the
    conf tests about 0.77 at step 100 (one point: 10 of the test batch's images)."""
    rng = np.random.default_rng(seed)
    colours = rng.integers(40, 216, (10, 3))
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        n = per_test if name == "test_batch.bin" else per_batch
        labels = rng.integers(0, 10, n)
        noise = rng.integers(-250, 250, (n, 3, 32 * 32))
        pixels = np.clip(colours[labels][:, :, None] + noise, 0, 255)
        records = np.concatenate([labels[:, None], pixels.reshape(n, -1)], axis=1)
        (folder / name).write_bytes(records.astype(np.uint8).tobytes())


def cifar_data(tmp_path):
    import importlib.util
    import io
    spec = importlib.util.spec_from_file_location(
        "create_data", os.path.join(EXAMPLES, "cifar10", "create_data.py"))
    create_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(create_data)
    write_cifar(tmp_path)
    create_data.create_data(str(tmp_path), str(tmp_path), log=io.StringIO())
    return {"examples/cifar10/": f"{tmp_path}/"}


CONFS = {   # conf, data, steps, test_steps
    "mnist mlp": (f"{EXAMPLES}/mnist/job.conf", lambda tmp: MNIST, 200, 5),
    "lenet": (f"{EXAMPLES}/mnist/conv.conf", lambda tmp: MNIST, 200, 5),
    "cifar10": (f"{EXAMPLES}/cifar10/job.conf", cifar_data, 100, 10),
}


@pytest.mark.parametrize("name", CONFS)
def test_singa_confs_reach_the_cpu_accuracy_on_the_gpu(tmp_path, name, monkeypatch):
    """The CPU on im2col (SINGA_KERNELS=numba), whose order of additions our GPU kernels
    follow: the GPU's test accuracy at the last step within a point of it; within 5 where the
    GPU's convolutions ran on cuDNN, which adds in its own order (as oneDNN does on the CPU:
    cifar10 tests 0.804 there against im2col's 0.766 at step 100, a chaotic net's drift)."""
    from singa.layers import kernels
    monkeypatch.setenv("SINGA_KERNELS", "numba")
    path, data, steps, test_steps = CONFS[name]
    replacements = data(tmp_path)
    accuracy = {}
    for run, place in (("cpu", None), ("gpu", [0])):
        m = conf_model(tmp_path, run, path, replacements)
        h = m.fit(nb_epoch=steps, test_steps=test_steps, test_freq=steps, disp_freq=steps // 4,
                  seed=11, progress=False, device=place)
        accuracy[run] = h.history["test_accuracy"][-1]
    engine = kernels.gpu_engine(0)
    print(f"{name}: test accuracy at step {steps}: CPU {accuracy['cpu']:.4f}, "
          f"GPU {accuracy['gpu']:.4f} (convolutions on {'cuDNN' if engine else 'im2col'})")
    assert accuracy["cpu"] > 0.2
    assert abs(accuracy["gpu"] - accuracy["cpu"]) <= (0.05 if engine else 0.01)


@pytest.mark.parametrize("name", CONFS)
def test_cuda_graphs_train_singa_confs_to_the_bits_of_op_by_op(tmp_path, name, monkeypatch):
    """After cuda_graphs.WARMUP steps a step's runs of capturable passes are captured and then
    launched as CUDA graphs, none failing: 12 steps give the bits of the same steps op by
    op."""
    path, data, _, _ = CONFS[name]
    replacements = data(tmp_path)
    capture, graphs, warnings, params = cuda_graphs.StepGraphs._captured, [], [], {}
    monkeypatch.setattr(cuda_graphs.StepGraphs, "_captured",
                        lambda self, segment: graphs.append(capture(self, segment)) or graphs[-1])
    monkeypatch.setattr(cuda_graphs.log, "warning", lambda text, *a: warnings.append(text % a))
    for run, warmup in (("graphs", cuda_graphs.WARMUP), ("by-op", 10 ** 9)):
        monkeypatch.setattr(cuda_graphs, "WARMUP", warmup)
        m = conf_model(tmp_path, run, path, replacements)
        m.fit(nb_epoch=12, seed=11, progress=False, device=[0])
        params[run] = {k: v.tobytes() for k, v in final_params(m).items()}
    assert warnings == [] and graphs
    assert params["graphs"] == params["by-op"]


def mlp(ws, **layout):
    m = Sequential('mlp')
    m.add(Dense(64, init='uniform', activation='tanh'))
    m.add(Dense(10, init='uniform', activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.05, momentum=0.9),
              cluster=Cluster(str(ws), **layout))
    return m


@pytest.fixture(scope="module")
def mnist():
    from singa.io.kvfile import KVFile
    from singa.io.records import decode_batch
    with KVFile(f"{FIX}/train-1000.bin") as f:
        x, y = decode_batch([v for _, v in f], 784)
    return x / np.float32(255), y


def test_a_gpu_job_resumed_on_the_gpu_continues_bit_exactly(tmp_path, mnist):
    m = mlp(tmp_path / "halves")
    m.fit(*mnist, nb_epoch=20, batch_size=50, seed=4, progress=False, device=[0])
    m.fit(*mnist, nb_epoch=20, batch_size=50, seed=4, progress=False, device=[0])
    whole = mlp(tmp_path / "whole")
    whole.fit(*mnist, nb_epoch=40, batch_size=50, seed=4, progress=False, device=[0])
    ours, theirs = final_params(m), final_params(whole)
    assert {k: v.tobytes() for k, v in ours.items()} == {k: v.tobytes() for k, v in theirs.items()}


def convnet(ws):
    m = Sequential('conv')
    m.add(Convolution2D(6, kernel=5, stride=2, pad=1, activation='relu'))
    m.add(MaxPooling2D(pool_size=2, stride=2))
    m.add(Convolution2D(8, kernel=3, pad=1, activation='relu'))
    m.add(Dense(10, activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.05, momentum=0.9),
              cluster=Cluster(str(ws)))
    return m


@pytest.mark.parametrize("engine", ["cudnn", "cuda"])
def test_a_convnet_resumed_on_the_gpu_continues_bit_exactly_on_each_engine(
        tmp_path, mnist, engine, monkeypatch):
    """cuDNN's deterministic algorithms (and the im2col path): 2 epochs, then 2 more from the
    snapshot, give the bits of 4 in one run."""
    from singa.layers import kernels
    import conftest
    if conftest.STANDIN and engine == "cudnn":
        import fake_cudnn
        fake_cudnn.installed(monkeypatch)
    monkeypatch.setenv("SINGA_GPU_KERNELS", engine)
    monkeypatch.setattr(kernels, "gpu_engine", kernels.functools.cache(
        kernels.gpu_engine.__wrapped__))
    x, y = mnist[0].reshape(-1, 1, 28, 28), mnist[1]
    m = convnet(tmp_path / "halves")
    m.fit(x, y, nb_epoch=2, batch_size=50, seed=4, progress=False, device=[0])
    m.fit(x, y, nb_epoch=2, batch_size=50, seed=4, progress=False, device=[0])
    whole = convnet(tmp_path / "whole")
    whole.fit(x, y, nb_epoch=4, batch_size=50, seed=4, progress=False, device=[0])
    ours, theirs = final_params(m), final_params(whole)
    assert {k: v.tobytes() for k, v in ours.items()} == {k: v.tobytes() for k, v in theirs.items()}


def test_a_caffe_lmdb_of_images_fed_to_the_gpu_gives_the_cpus_crops_in_its_order(
        tmp_path, monkeypatch):
    """Caffe's LMDB of PNG and JPEG Datums through RecordInput (its bytes to the device, the
    mean and std there) and ImagePreprocess on the GPU (crop, mirror, scale): each step's
    crops are the CPU's to the bit, and training is the CPU's within rounding."""
    pytest.importorskip("lmdb")
    pytest.importorskip("PIL")
    cpu, gpu = (fed(tmp_path, name, monkeypatch, 8, device)
                for name, device in (("cpu", None), ("gpu", [0])))
    assert [c.tobytes() for c in gpu[0]] == [c.tobytes() for c in cpu[0]]
    for name, values in cpu[2].items():
        assert np.allclose(gpu[2][name], values, rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("first, then", [([0], None), (None, [0])])
def test_snapshots_move_between_the_gpu_and_the_cpu(tmp_path, mnist, first, then):
    """20 steps on one device, 20 more on the other: within rounding of 40 on the CPU."""
    m = mlp(tmp_path / "moved")
    m.fit(*mnist, nb_epoch=20, batch_size=50, seed=4, progress=False, device=first)
    m.fit(*mnist, nb_epoch=20, batch_size=50, seed=4, progress=False, device=then)
    whole = mlp(tmp_path / "cpu")
    whole.fit(*mnist, nb_epoch=40, batch_size=50, seed=4, progress=False)
    for name, values in final_params(whole).items():
        assert np.allclose(final_params(m)[name], values, rtol=1e-3, atol=1e-5), name


def test_two_workers_share_one_gpu_as_one_worker_trains(tmp_path, mnist):
    """Sandblaster, gpu [0, 0]: two workers on GPU 0, each half the batch, train as one."""
    runs = {}
    for name, layout in (("one", {}), ("two", {"nworkers_per_group": 2,
                                               "nworkers_per_procs": 2})):
        h = mlp(tmp_path / name, **layout).fit(*mnist, nb_epoch=30, batch_size=50, seed=4,
                                                progress=False, device=[0, 0])
        runs[name] = h.history["loss"]
    assert np.allclose(runs["two"], runs["one"], rtol=1e-3), runs


def test_cudnn_hybrid_conf_trains_with_its_partitions_on_two_gpus_as_on_the_cpu(tmp_path):
    """SINGA's cifar10/cudnn_hybrid.conf: the two partitions of its group on GPUs 0 and 1 of
    one process (peer copies of the bridges' blobs and of the params) train as on the CPU:
    the test accuracy at step 100 within one point. Needs two GPUs."""
    from singa import device
    if device.cupy().cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU: the partitions of cudnn_hybrid.conf need two")
    replacements = {**cifar_data(tmp_path), "\ngpu: 0\ngpu: 1\n": "\n"}
    accuracy = {}
    for run, place in (("cpu", None), ("gpu", [0, 1])):
        m = conf_model(tmp_path, run, f"{singa.HOME}/tests/fixtures/confs/cifar10/"
                       f"cudnn_hybrid.conf", replacements)
        h = m.fit(nb_epoch=100, test_steps=10, test_freq=100, disp_freq=25, seed=11,
                  progress=False, device=place)
        accuracy[run] = h.history["test_accuracy"][-1]
    print(f"cudnn_hybrid: test accuracy at step 100: CPU {accuracy['cpu']:.4f}, "
          f"GPUs 0 and 1 {accuracy['gpu']:.4f}")
    assert accuracy["cpu"] > 0.2
    assert abs(accuracy["gpu"] - accuracy["cpu"]) <= 0.01


def apart(gpu, cpu):
    """{param: |gpu - cpu| / |cpu|} (Frobenius norms) of two runs' final params."""
    assert gpu.keys() == cpu.keys()
    return {k: float(np.linalg.norm(gpu[k] - v) / np.linalg.norm(v)) for k, v in cpu.items()}


def test_an_rbm_trains_with_cd_on_the_gpu_as_on_the_cpu(tmp_path):
    """kCD, SINGA's rbm1.conf: RBMVis/RBMHid's Gibbs samples are drawn on the host from the
    CPU run's numbers, against probabilities that CUDA's exp rounds its own way, so a sample
    may flip where a draw falls within an ulp of its probability: each param within 1e-3 of
    the CPU's (a sample flipped moves one weight by about 1e-5 of the whole; a step lost, a
    phase's sign wrong or a sample not drawn moves them by far more)."""
    runs = on_cpu_and_gpu(lambda run: conf_model(tmp_path, run, f"{EXAMPLES}/rbm/rbm1.conf",
                                                 MNIST),
                          nb_epoch=20, test_steps=2, test_freq=10, disp_freq=10, seed=7)
    rel = apart(runs["gpu"], runs["cpu"])
    print(f"rbm1 (kCD), 20 steps: GPU against CPU, relative: {rel}")
    assert max(rel.values()) <= 1e-3, rel


def test_char_rnn_trains_with_bptt_on_the_gpu_as_on_the_cpu(tmp_path):
    """kBPTT, SINGA's char-rnn conf (smaller GRUs, 5 steps unrolled): CharRNN and OneHot on
    the host, the unrolled GRUs and the output layers on the GPU; each param within 1e-4 of
    the CPU's after 20 steps (CUDA's tanh and exp, cuBLAS's sums: rounding)."""
    char_rnn_data(tmp_path)
    runs = on_cpu_and_gpu(lambda run: char_rnn_model(tmp_path, run), nb_epoch=20,
                          disp_freq=10, seed=7)
    rel = apart(runs["gpu"], runs["cpu"])
    print(f"char-rnn (kBPTT), 20 steps: GPU against CPU, relative: {rel}")
    assert max(rel.values()) <= 1e-4, rel


def child(pid, workspace, steps, conn):
    from bench_mlp_step import mlp_job   # noqa: E402  (bench/, on the path below)
    job = mlp_job(workspace, 50)
    job.train_steps, job.test_steps, job.disp_freq, job.checkpoint_freq = steps, 0, 0, 0
    job.cluster.server_worker_separate = True
    job.gpu.append(0)       # the worker process's worker; the server process has none: CPU
    with threads.limit(job.num_openblas_threads):
        transport = Transport()
        conn.send(transport.listen("127.0.0.1"))
        endpoints = conn.recv()
        Process(job, Place(pid, topology.nprocs(job.cluster), endpoints.__getitem__,
                           transport)).run()
    conn.send("done")


@pytest.mark.skipif(STANDIN, reason="the stand-in lives in this process only")
def test_a_job_of_two_processes_mixes_a_gpu_worker_and_a_cpu_server(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(singa.HOME, "bench"))
    from bench_mlp_step import mlp_job
    job = mlp_job(str(tmp_path), 50)
    job.cluster.server_worker_separate = True
    assert topology.nprocs(job.cluster) == 2
    ctx = mp.get_context("spawn")      # no CUDA context may cross a fork
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=child, args=(pid, str(tmp_path), 30, c))
             for pid, (_, c) in enumerate(pipes)]
    for p in procs:
        p.start()
    endpoints = {pid: parent.recv() for pid, (parent, _) in enumerate(pipes)}
    for parent, _ in pipes:
        parent.send(endpoints)
    for parent, _ in pipes:
        assert parent.poll(300) and parent.recv() == "done"
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    snap = checkpoint.latest_snapshot(checkpoint.folder(str(tmp_path)), 1)
    assert snap is not None and snap.step == 30
