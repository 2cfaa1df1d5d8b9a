"""Model partitioning: the MNIST MLP trained by 1 worker, by 2 at partition_dim 0 and by 2 at
partition_dim 1 (synchronous, same seed, same data) follows one loss curve; SINGA's hybrid
cifar10 conf trains."""
import io
import json
import logging
import os
import re

import numpy as np
import pytest

import singa
from singa.checkpoint import CheckpointReader
from singa.device import threads
from singa.job.config import parse_job
from singa.train.runtime import Process

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


def numbers(lines):
    return [float(x) for line in lines for x in re.findall(r"\d+\.\d+", line)]


def train_in_process(job, caplog):
    """The job's process run here, with the compute threads and BLAS at one thread as the
    driver runs it (not OpenBLAS's own threads called by both worker threads at once)."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="singa"), threads.limit(job.num_openblas_threads):
        Process(job).run()
    lines = [r.getMessage() for r in caplog.records]
    curve = [(int(m[1]), float(m[2]), float(m[3])) for m in map(TRAIN.fullmatch, lines) if m]
    return curve, lines


@pytest.mark.parametrize("dims", ["dim0", "dim1"])
def test_two_workers_follow_the_loss_curve_of_one(dims, tmp_path, caplog):
    one, one_lines = train_in_process(job_conf(tmp_path, "one"), caplog)
    test_lines = [line for line in one_lines if line.startswith("   Loss")]
    assert len(test_lines) == 2
    two, lines = train_in_process(job_conf(tmp_path, dims, TWO, DIM1 if dims == "dim1" else None),
                                  caplog)
    assert [s for s, _, _ in one] == [s for s, _, _ in two] == list(range(STEPS))
    assert one[-1][1] < one[0][1]
    diff = max(abs(a[1] - b[1]) for a, b in zip(one, two))
    print(f"{dims}: max loss difference over {STEPS} steps = {diff:.2e}")
    assert diff < 1e-5       # the same sums cut differently: float32 rounding, 6 printed decimals
    np.testing.assert_allclose([a for _, _, a in two], [a for _, _, a in one], atol=1e-5)
    assert sum(line.startswith("Test @ step") for line in lines) == 2
    # the test net, partitioned alike, gives the 1-worker test metrics
    ours = [line for line in lines if line.startswith("   Loss")]
    np.testing.assert_allclose(numbers(ours), numbers(test_lines), atol=2e-6)


@pytest.mark.parametrize("name", ["hybrid.conf", "cudnn_hybrid.conf"])
def test_cifar10_hybrid_conf_trains_and_its_graph_shows_the_partition_layers(tmp_path,
                                                                             run_driver, name):
    """SINGA's cifar10/hybrid.conf (conv layers on dim 0, ip1 on dim 1, 2 workers), its batch
    cut to 10, on CIFAR-format shards made by create_data.py; cudnn_hybrid.conf runs its cuDNN
    layer types on the CPU."""
    from test_cifar10 import create_data, write_cifar_batches
    write_cifar_batches(tmp_path)
    create_data.create_data(str(tmp_path), str(tmp_path), log=io.StringIO())
    with open(os.path.join(singa.HOME, "tests", "fixtures", "confs", "cifar10", name)) as f:
        text = f.read()
    for field, value in (("train_steps", 40), ("disp_freq", 10)):
        text, n = re.subn(rf"(?m)^{field}: \d+$", f"{field}: {value}", text)
        assert n == 1, field
    for old, new in (("examples/cifar10/", f"{tmp_path}/"), ("batchsize: 100", "batchsize: 10"),
                     ('workspace: "examples/cifar10"', f'workspace: "{tmp_path / "ws"}"')):
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / name).write_text(re.sub(r"(?m)^gpu: \d+\n", "", text))    # no GPU: on the CPU
    r = run_driver(tmp_path / name)
    assert r.returncode == 0, r.stderr
    losses = [float(x) for x in re.findall(r"Train @ step \d+  Loss = ([\d.]+)", r.stderr)]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
    graph = json.loads((tmp_path / "ws" / "visualization" / "train_net.json").read_text())
    names = {node["id"] for node in graph["nodes"]}
    assert {"0#ip1@0", "0#ip1@1", "split(0#pool3)@0", "concate(split(0#pool3))@1",
            "slice(0#ip1)@1", "concate(slice(0#ip1))@0",
            "bridge_src(slice(0#ip1)@1->concate(slice(0#ip1))@0)",
            "bridge_dst(slice(0#ip1)@1->concate(slice(0#ip1))@0)"} <= names
    for w in (0, 1):    # each worker's file holds its piece of ip1's weight under SINGA's name
        ckpt = CheckpointReader(str(tmp_path / "ws" / "checkpoint" / f"step40-worker{w}.bin"))
        assert ("0#w4" in ckpt.names) and (("0#w1" in ckpt.names) == (w == 0))
        assert ckpt.param("0#w4").shape[0] == 5


@pytest.mark.parametrize("dims", ["dim0", "dim1"])
def test_two_workers_in_two_processes_follow_the_curve_of_one(dims, fixture_job, singa_conf,
                                                             zk_server, tmp_path):
    """Real ZooKeeper and tcp: each process runs one worker of the MLP; bridge blobs and
    metrics cross between the processes' stubs."""
    from test_distributed import losses, run_job

    def conf(name, cluster, edits=None):
        return fixture_job(name + ".conf", workspace=tmp_path / name, head="seed: 7\n", edits={
            "nserver_groups: 1": f"nserver_groups: 1 {cluster}", "train_steps: 200":
            "train_steps: 20", "disp_freq: 20": "disp_freq: 2", **(edits or {})})
    (rc, one), = run_job(conf("one", ""), singa_conf, zk_server, 1)
    assert rc == 0, one
    two = run_job(conf("two", "nworkers_per_group: 2 nworkers_per_procs: 1",
                       DIM1 if dims == "dim1" else None), singa_conf, zk_server, 2)
    assert all(rc == 0 for rc, _ in two), "\n".join(log for _, log in two)
    curve, expected = losses(two[0][1] + two[1][1]), losses(one)
    assert len(curve) == len(expected) == 10 and curve[-1] < curve[0]
    diff = max(abs(a - b) for a, b in zip(curve, expected))
    print(f"{dims} in 2 processes: max loss difference over 20 steps = {diff:.2e}")
    assert diff < 1e-5


@pytest.mark.parametrize("workers", [1, 3])
def test_two_piece_snapshot_resumes_with_another_number_of_workers(workers, tmp_path, caplog):
    """A 2-worker partition_dim 1 job's step-15 snapshot (ip1's and ip2's params in 2 pieces)
    resumes with 1 and with 3 workers: the pieces are joined and re-cut, and training goes on
    along the uninterrupted run's curve. (A batch of 48: SINGA gives each of K partitions
    batchsize // K rows, so every K here reads the same rows.)"""
    steps = {"checkpoint_freq: 100": "checkpoint_freq: 15", "batchsize: 50": "batchsize: 48"}
    whole, _ = train_in_process(job_conf(tmp_path, "two", TWO, {**DIM1, **steps}), caplog)
    snapshot = tmp_path / "two" / "checkpoint"
    assert CheckpointReader(str(snapshot / "step15-worker1.bin")).param("0#weight1").shape == (32, 784)
    cluster = "" if workers == 1 else f"nworkers_per_group: {workers} nworkers_per_procs: {workers}"
    job = job_conf(tmp_path, "more", cluster, {**(DIM1 if workers > 1 else {}), **steps})
    for f in os.listdir(snapshot):
        if f.startswith("step15-"):
            os.link(snapshot / f, tmp_path / "more" / "checkpoint" / f)
    from singa.train.runtime import resume_from
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="singa"):
        snap = resume_from(job, str(tmp_path / "more" / "checkpoint"))
        Process(job, resume=snap).run()
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("Param 0#weight1: joined from") for line in lines), lines
    resumed = [(int(m[1]), float(m[2])) for m in map(TRAIN.fullmatch, lines) if m]
    assert [s for s, _ in resumed] == list(range(15, STEPS))
    diff = max(abs(loss - whole[s][1]) for s, loss in resumed)
    print(f"2 pieces resumed in {workers} worker(s): max loss difference = {diff:.2e}")
    assert diff < 1e-5


def test_two_piece_snapshot_fine_tunes_one_worker_net_with_an_extra_layer(tmp_path, caplog):
    """checkpoint_path naming both files of a 2-worker partition_dim 1 snapshot feeds a
    1-worker net with one more layer: ip1 and ip2 joined from their pieces, the new layer
    freshly initialised; its step-0 snapshot holds the joined values, and the loss falls."""
    train_in_process(job_conf(tmp_path, "two", TWO, DIM1), caplog)
    files = [tmp_path / "two" / "checkpoint" / f"step{STEPS}-worker{w}.bin" for w in (0, 1)]
    extra = {'srclayers: "sig1"': 'srclayers: "sig3"',
             'layer { name: "sig1" type: kSigmoid srclayers: "ip1" }':
             'layer { name: "sig1" type: kSigmoid srclayers: "ip1" }\n'
             '  layer { name: "ip3" type: kInnerProduct srclayers: "sig1" '
             'innerproduct_conf { num_output: 64 }\n'
             '    param { name: "weight3" init { type: kGaussian mean: 0 std: 0.05 } }\n'
             '    param { name: "bias3" init { type: kConstant value: 0 } } }\n'
             '  layer { name: "sig3" type: kSigmoid srclayers: "ip3" }'}
    job = job_conf(tmp_path, "tuned", "", extra)
    job.checkpoint_path.extend(str(f) for f in files)
    job.checkpoint_freq = STEPS
    tuned, lines = train_in_process(job, caplog)
    for name in ("weight1", "bias1", "weight2", "bias2"):
        assert any(line.startswith(f"Param 0#{name}: joined from {files[0]}") for line in lines)
    assert any(line.startswith("Param 0#weight3: freshly initialised") for line in lines), lines
    start = CheckpointReader(str(tmp_path / "tuned" / "checkpoint" / "step0-worker0.bin"))
    pieces = [CheckpointReader(str(f)) for f in files]
    for name in ("0#weight1", "0#bias2"):
        np.testing.assert_array_equal(start.param(name),
                                      np.concatenate([r.param(name) for r in pieces]))
    losses = [loss for _, loss, _ in tuned]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]), losses
