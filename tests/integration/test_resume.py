"""`-resume`, retention and bad checkpoint input, run as users run them (driver processes on a
real ZooKeeper): a resumed run reaches the uninterrupted run's parameters bit for bit."""
import os
import re
import shutil
import subprocess
import time

import numpy as np
import pytest
from google.protobuf import text_format

from singa import checkpoint
from singa.proto import common_pb2, job_pb2

from conftest import FIXTURES, PYTHON

BITEXACT = dict(seed=7, train_steps=200, test_freq=40, test_steps=2, disp_freq=50,
                checkpoint_freq=30)


def bitexact_edit(job):
    """Momentum SGD with a FixedStep LR (updater and LR state matter), a kDropout layer (RNG
    state matters) and random_skip on both readers (reader state matters)."""
    job.updater.learning_rate.type = job_pb2.kFixedStep
    job.updater.learning_rate.fixedstep_conf.step[:] = [0, 90]
    job.updater.learning_rate.fixedstep_conf.step_lr[:] = [0.05, 0.02]
    layers = list(job.neuralnet.layer)
    del job.neuralnet.layer[:]
    for layer in layers:
        if layer.name == "data":
            layer.store_conf.random_skip = 300 if layer.include[0] == job_pb2.kTrain else 50
        if layer.name == "ip2":
            job.neuralnet.layer.add(name="drop1", type=job_pb2.kDropout, srclayers=["sig1"]) \
                .dropout_conf.dropout_ratio = 0.3
            layer.srclayers[:] = ["drop1"]
        job.neuralnet.layer.add().CopyFrom(layer)


def driver(conf, singa_conf, *flags, env=None):
    return subprocess.run([PYTHON, "-m", "singa.driver", "-conf", str(conf), "-singa_conf",
                           str(singa_conf), *flags], capture_output=True, text=True, timeout=180,
                          env=None if env is None else {**os.environ, **env})


def logged_tests(log):
    lines = log.splitlines()
    return {int(re.search(r"Test @ step (\d+)", a).group(1)): b.split("]", 1)[1].strip()
            for a, b in zip(lines, lines[1:]) if "Test @ step" in a}


def assert_same_training_state(path_a, path_b):
    """Params, versions, updater buffers, LR index, train RNG and train reader: equal bytes."""
    a, b = checkpoint.CheckpointReader(str(path_a)), checkpoint.CheckpointReader(str(path_b))
    assert a.names == b.names
    for name in a.names:
        assert a.param(name).tobytes() == b.param(name).tobytes(), name
        assert a.version(name) == b.version(name), name
    sa, sb = a.snapshot_state(), b.snapshot_state()
    assert sa.step == sb.step and sa.lr_index == sb.lr_index
    assert sa.param_state.keys() == sb.param_state.keys()
    for name, bufs in sa.param_state.items():
        assert [x.tobytes() for x in bufs] == [x.tobytes() for x in sb.param_state[name]], name
    assert sa.rng["train"] == sb.rng["train"]
    train_readers = [{k: v for k, v in s.reader.items() if k.startswith("train/")} for s in (sa, sb)]
    assert train_readers[0] and train_readers[0] == train_readers[1]


@pytest.fixture(scope="module")
def run_a(tmp_path_factory, zk_server):
    """The uninterrupted bit-exactness run: (folder of its checkpoints, its log)."""
    d = tmp_path_factory.mktemp("run_a")
    singa_conf = d / "singa.conf"
    singa_conf.write_text(f'zookeeper_host: "{zk_server}"\nlog_dir: "{d / "log"}/"\n')
    conf = write_bitexact(d, "a", d / "ws")
    r = driver(conf, singa_conf)
    assert r.returncode == 0, r.stderr
    return d / "ws" / "checkpoint", r.stderr


def write_bitexact(folder, name, workspace, **fields):
    job = job_pb2.JobProto()
    with open(os.path.join(FIXTURES, "job.conf")) as f:
        text_format.Parse(f.read(), job)
    for key, value in {**BITEXACT, **fields}.items():
        setattr(job, key, value)
    job.cluster.workspace = str(workspace)
    os.makedirs(workspace, exist_ok=True)
    bitexact_edit(job)
    path = folder / f"{name}.conf"
    path.write_text(text_format.MessageToString(job))
    return path


def test_resume_after_sigkill_is_bit_exact(run_a, tmp_path, singa_conf, singa_popen):
    folder_a, _ = run_a
    conf = write_bitexact(tmp_path, "b", tmp_path / "ws")
    folder = tmp_path / "ws" / "checkpoint"
    proc = singa_popen(conf)
    deadline = time.monotonic() + 120
    while not (folder / "step60-worker0.meta").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "no step60 snapshot"
        time.sleep(0.005)
    proc.kill()
    assert proc.wait() == -9, "the run ended before it could be killed"
    snap = checkpoint.latest_snapshot(str(folder))
    assert 60 <= snap.step < 200
    r = driver(conf, singa_conf, "-resume")
    assert r.returncode == 0, r.stderr
    assert f"Resume from step {snap.step}" in r.stderr
    assert_same_training_state(folder_a / "step200-worker0.bin", folder / "step200-worker0.bin")


def test_graceful_stop_then_resume_is_bit_exact(run_a, tmp_path, singa_conf):
    folder_a, log_a = run_a
    first = write_bitexact(tmp_path, "first", tmp_path / "ws", train_steps=100)
    assert driver(first, singa_conf).returncode == 0
    r = driver(write_bitexact(tmp_path, "second", tmp_path / "ws"), singa_conf, "-resume")
    assert r.returncode == 0, r.stderr
    assert "Resume from step 100" in r.stderr
    final = tmp_path / "ws" / "checkpoint" / "step200-worker0.bin"
    assert final.read_bytes() == (folder_a / "step200-worker0.bin").read_bytes()
    tests_a = logged_tests(log_a)
    assert logged_tests(r.stderr) == {s: tests_a[s] for s in (120, 160)}


def conv_edit(path, **fields):
    """The bit-exactness job with a padded convolution and a max pooling before a wider ip1,
    so that the layers' work is cut in chunks and pieces."""
    job = text_format.Parse(path.read_text(), job_pb2.JobProto())
    for key, value in fields.items():
        setattr(job, key, value)
    layers = list(job.neuralnet.layer)
    del job.neuralnet.layer[:]
    for layer in layers:
        if layer.name == "data":
            layer.store_conf.shape[:] = [1, 28, 28]
        if layer.name == "ip1":
            conv = job.neuralnet.layer.add(name="conv1", type=job_pb2.kCConvolution,
                                           srclayers=["data"])
            conv.convolution_conf.num_filters, conv.convolution_conf.kernel = 8, 5
            conv.convolution_conf.pad = 2
            conv.param.add(name="wconv").init.CopyFrom(job_pb2.ParamGenProto(
                type=job_pb2.kGaussian, std=0.1))
            conv.param.add(name="bconv").init.type = job_pb2.kConstant
            job.neuralnet.layer.add(name="pool1", type=job_pb2.kCPooling, srclayers=["conv1"]) \
                .pooling_conf.CopyFrom(job_pb2.PoolingProto(kernel=2, stride=2))
            layer.srclayers[:] = ["pool1"]
            layer.innerproduct_conf.num_output = 256
        job.neuralnet.layer.add().CopyFrom(layer)
    path.write_text(text_format.MessageToString(job))
    return path


@pytest.mark.parametrize("first_kernels, kernels", [("numpy", "numba"), ("onednn", "onednn")])
def test_resume_on_other_thread_counts_is_bit_exact(tmp_path, singa_conf, first_kernels,
                                                    kernels):
    # 1 compute thread all along, against 2 threads up to step 60 and then 3: chunks and
    # pieces follow from the shapes alone, so every thread count computes the same bits; the
    # first 60 steps on numpy's copies (singa.layers.kernels), the rest on numba's (the same
    # bits), or all on oneDNN's convolution
    if kernels == "onednn":
        onednn = pytest.importorskip("singa.layers.kernels.onednn")
        try:
            onednn.library()
        except OSError as e:
            pytest.skip(str(e))
    ref = conv_edit(write_bitexact(tmp_path, "ref", tmp_path / "ref", train_steps=120))
    assert driver(ref, singa_conf, env={"SINGA_KERNELS": kernels}).returncode == 0
    first = conv_edit(write_bitexact(tmp_path, "first", tmp_path / "ws", train_steps=60),
                      num_openblas_threads=2)
    assert driver(first, singa_conf, env={"SINGA_KERNELS": first_kernels}).returncode == 0
    second = conv_edit(write_bitexact(tmp_path, "second", tmp_path / "ws", train_steps=120),
                       num_openblas_threads=3)
    r = driver(second, singa_conf, "-resume", env={"SINGA_KERNELS": kernels})
    assert r.returncode == 0, r.stderr
    assert "Resume from step 60" in r.stderr
    assert_same_training_state(tmp_path / "ref" / "checkpoint" / "step120-worker0.bin",
                               tmp_path / "ws" / "checkpoint" / "step120-worker0.bin")


def test_resume_from_snapshot_after_a_test_keeps_test_stream(run_a, tmp_path, singa_conf):
    folder_a, log_a = run_a
    folder = tmp_path / "ws" / "checkpoint"
    folder.mkdir(parents=True)
    for step in (90, 120):   # as if killed right after writing step 120 (tested at 120 too)
        for ext in (".bin", ".meta"):
            shutil.copy(folder_a / f"step{step}-worker0{ext}", folder)
    r = driver(write_bitexact(tmp_path, "b", tmp_path / "ws"), singa_conf, "-resume")
    assert r.returncode == 0, r.stderr
    assert_same_training_state(folder_a / "step200-worker0.bin", folder / "step200-worker0.bin")
    assert logged_tests(r.stderr)[160] == logged_tests(log_a)[160]


def test_retention_keeps_two_newest_and_best(mlp_job, run_driver, tmp_path):
    folder = tmp_path / "ws" / "checkpoint"
    job = mlp_job(train_steps=1000, checkpoint_freq=100, test_freq=100, disp_freq=0,
                  checkpoint_keep_newest=2, checkpoint_keep_best="accuracy")
    r = run_driver(job)
    assert r.returncode == 0, r.stderr
    tests = logged_tests(r.stderr)
    accuracy = {s: float(line.rsplit("=", 1)[1]) for s, line in tests.items()}
    best = max(accuracy, key=lambda s: (accuracy[s], s))
    kept = {900, 1000, best}
    assert sorted(os.listdir(folder)) == sorted(f"step{s}-worker0{ext}" for s in kept
                                                for ext in (".bin", ".meta"))
    assert checkpoint.best_snapshot(str(folder), "accuracy").step == best

    r = run_driver(job, "-resume")
    assert r.returncode == 0, r.stderr
    assert "Resume from step 1000" in r.stderr

    r = run_driver(mlp_job("best", checkpoint_path=["best"]), "-test")
    assert r.returncode == 0, r.stderr
    assert f"Load from checkpoint file {folder / f'step{best}-worker0.bin'}" in r.stderr
    assert list(logged_tests(r.stderr).values()) == [tests[best]]


def error_line(r):
    """The one `singa: ...` line of a failed run (exit 2, no traceback)."""
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("singa: ")]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_corrupt_file_in_checkpoint_path(mlp_job, run_driver, tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\xff" * 100)
    line = error_line(run_driver(mlp_job(checkpoint_path=[str(bad)])))
    assert str(bad) in line and "corrupt" in line


def test_wrong_param_shape_names_param_shapes_and_file(mlp_job, run_driver, tmp_path):
    path = checkpoint.write_file(str(tmp_path / "small.bin"),
                                 [("0#weight1", np.zeros((32, 784), np.float32), 5)])
    line = error_line(run_driver(mlp_job(checkpoint_path=[path])))
    assert all(s in line for s in ("0#weight1", "(32, 784)", "(64, 784)", path)), line


def test_missing_file_in_checkpoint_path(mlp_job, run_driver, tmp_path):
    missing = str(tmp_path / "nowhere" / "step5-worker0")
    line = error_line(run_driver(mlp_job(checkpoint_path=[missing]), "-test"))
    assert "not found" in line and missing in line


def test_resume_with_empty_folder_starts_fresh(mlp_job, run_driver, tmp_path):
    (tmp_path / "ws" / "checkpoint").mkdir(parents=True)
    r = run_driver(mlp_job(train_steps=20, checkpoint_freq=0, test_freq=0), "-resume")
    assert r.returncode == 0, r.stderr
    assert "No complete checkpoint in" in r.stderr and "starting from step 0" in r.stderr
    final = checkpoint.CheckpointReader(str(tmp_path / "ws" / "checkpoint" / "step20-worker0.bin"))
    assert [v for *_, v in final.meta()] == [20] * 4


def rewrite_state(path, change):
    """Rewrite the snapshot file `path` (checksummed anew) with `change(state)` applied."""
    r = checkpoint.CheckpointReader(str(path))
    params = [(name, r.param(name), r.version(name)) for name in r.names]
    state = r.snapshot_state()
    change(state)
    checkpoint.write_file(str(path), params, state)


def test_resume_skips_a_snapshot_with_a_malformed_rng_state(mlp_job, run_driver, tmp_path):
    job = dict(train_steps=20, checkpoint_freq=10, test_freq=0)
    assert run_driver(mlp_job(**job)).returncode == 0
    bad = tmp_path / "ws" / "checkpoint" / "step20-worker0.bin"
    rewrite_state(bad, lambda st: st.rng["train"].update(bit_generator="MT19937"))
    r = run_driver(mlp_job(**dict(job, train_steps=30)), "-resume")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"Skipping checkpoint step20: checkpoint {bad}: RNG state of train is for 'MT19937', " \
           f"not PCG64" in r.stderr
    assert "Resume from step 10" in r.stderr


def test_resume_with_updater_state_of_another_updater_starts_it_afresh(mlp_job, run_driver, tmp_path):
    job = dict(train_steps=20, checkpoint_freq=10, test_freq=0)
    assert run_driver(mlp_job(**job)).returncode == 0
    snap = tmp_path / "ws" / "checkpoint" / "step20-worker0.bin"
    rewrite_state(snap, lambda st: st.param_state.update(
        {name: bufs * 3 for name, bufs in st.param_state.items()}))
    r = run_driver(mlp_job(**dict(job, train_steps=30)), "-resume", timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"Param 0#weight1: {snap} holds 3 updater buffers, the updater keeps 1: its state " \
           f"starts afresh" in r.stderr


@pytest.mark.parametrize("flags", [(), ("-test",)], ids=["train", "test"])
def test_checkpoint_path_with_a_non_utf8_param_name_is_one_line(mlp_job, run_driver, tmp_path, flags):
    msg = common_pb2.BlobProtos(version=[1])
    msg.blob.add(shape=[2], data=[1.0, 2.0])
    bad = tmp_path / "bad"
    bad.write_bytes(msg.SerializeToString() + b"\x22\x03\xff\xfeA")
    line = error_line(run_driver(mlp_job(checkpoint_path=[str(bad)]), *flags))
    assert line == f"singa: checkpoint {bad}: name b'\\xff\\xfeA' is not UTF-8 text"


def test_snapshot_of_two_model_pieces_resumes_bit_exact_in_one_worker(run_a, tmp_path, singa_conf):
    """step100 re-written as 2 workers' files, each param cut by rows into pieces under its
    name (SINGA's layout, plus our piece records), its updater buffers likewise: one worker
    joins them and ends where the uninterrupted run does."""
    folder_a, _ = run_a
    assert driver(write_bitexact(tmp_path, "first", tmp_path / "ws", train_steps=100),
                  singa_conf).returncode == 0
    path = tmp_path / "ws" / "checkpoint" / "step100-worker0.bin"
    r = checkpoint.CheckpointReader(str(path))
    buffers = r.snapshot_state().param_state
    for k in range(2):
        st = r.snapshot_state() if k == 0 else checkpoint.SnapshotState(step=100)
        st.nworkers = 2
        st.param_state = {n: [np.array_split(b, 2)[k] for b in bufs] for n, bufs in buffers.items()}
        checkpoint.write_file(str(path.parent / f"step100-worker{k}.bin"),
                              [(n, np.array_split(r.param(n), 2)[k], r.version(n), (0, k, 2))
                               for n in r.names], st)
    out = driver(write_bitexact(tmp_path, "second", tmp_path / "ws"), singa_conf, "-resume")
    assert out.returncode == 0, out.stderr
    assert "Resume from step 100" in out.stderr
    assert f"Param 0#weight1: joined from {path} [0:32] + {path.parent}/step100-worker1.bin " \
           f"[32:64]" in out.stderr
    final = tmp_path / "ws" / "checkpoint" / "step200-worker0.bin"
    assert_same_training_state(folder_a / "step200-worker0.bin", final)
