"""Training through the `singa` driver as a user runs it: real ZooKeeper, real process, real data."""
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import singa
from conftest import zookeeper
from singa.checkpoint import CheckpointReader
from singa.cluster.job_manager import JobManager
from singa.cluster.zk import ZKService, job_path


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory):
    """This module's own ZooKeeper: its tests list every job, so no other module's may be there
    (jobs killed elsewhere stay, their nodes protected)."""
    yield from zookeeper(tmp_path_factory)


GLOG = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+:\d+\] (.*)")
TRAIN = re.compile(r"Train @ step (\d+)  Loss = (\d+\.\d{6}), accuracy = (\d+\.\d{6})")
TEST = re.compile(r"Test @ step (\d+)")
RESULT = re.compile(r"   Loss = (\d+\.\d{6}), accuracy = (\d+\.\d{6})")
MNIST = os.path.join(singa.HOME, "examples", "mnist")
FIXTURES = os.path.join(singa.HOME, "tests", "fixtures", "singa-0.3")
PYTHON = os.path.join(singa.HOME, ".venv", "bin", "python")


def messages(stderr):
    """The messages of the glog lines in `stderr`; every line must be one."""
    lines = stderr.splitlines()
    found = [GLOG.fullmatch(line) for line in lines]
    assert all(found), [line for line, m in zip(lines, found) if not m][:3]
    return [m.group(1) for m in found]


def metrics(msgs):
    """[("Train"|"Test", step, loss, accuracy)] from the messages, in log order."""
    out = []
    for i, msg in enumerate(msgs):
        if m := TRAIN.fullmatch(msg):
            out.append(("Train", int(m[1]), float(m[2]), float(m[3])))
        elif m := TEST.fullmatch(msg):
            r = RESULT.fullmatch(msgs[i + 1])
            assert r, f"`Test @ step {m[1]}` is followed by {msgs[i + 1]!r}"
            out.append(("Test", int(m[1]), float(r[1]), float(r[2])))
    return out


def singa_fixture_log():
    with open(os.path.join(FIXTURES, "run-1worker", "singa.log")) as f:
        return metrics([line.split("] ", 1)[1] for line in f.read().splitlines()])


def test_fixture_job_trains_like_singa_and_registers_in_zookeeper(
        fixture_job, singa_conf, zk_server, tmp_path):
    conf = fixture_job()
    with ZKService(zk_server) as zk:
        # job ids are the sequence numbers of one znode: the driver's job is the next one
        job_id = JobManager(zk).new_job_id() + 1
        seen = []
        zk.client.DataWatch(f"{job_path(job_id)}/proc/proc-0",
                            lambda data, stat: seen.append((data, stat.ephemeralOwner)) if data else None)
        proc = subprocess.Popen([PYTHON, "-m", "singa.driver", "-conf", str(conf),
                                 "-singa_conf", str(singa_conf)],
                                cwd=tmp_path, stderr=subprocess.PIPE, text=True)
        _, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr
        assert (f"localhost:0|{proc.pid}".encode(), True) in [(d, o != 0) for d, o in seen]
        assert (job_id, 0) in JobManager(zk).list_jobs(all=True)     # the job stays, its process is gone
        assert job_id not in [j for j, _ in JobManager(zk).list_jobs()]

    msgs = messages(stderr)
    ours = metrics(msgs)
    assert [(k, s) for k, s, _, _ in ours] == [(k, s) for k, s, _, _ in singa_fixture_log()]
    train = {s: loss for k, s, loss, _ in ours if k == "Train"}
    assert train[180] < train[0]
    test = {s: acc for k, s, _, acc in ours if k == "Test"}
    assert test[100] >= 0.6

    folder = tmp_path / "ws" / "checkpoint"
    for step in (0, 100, 200):
        assert (folder / f"step{step}-worker0.bin").is_file()
    assert set(CheckpointReader(str(folder / "step200-worker0.bin")).names) == {
        "0#weight1", "0#bias1", "0#weight2", "0#bias2"}

    log_file = tmp_path / "log" / f"{job_id}-fixture-mlp.log"
    assert metrics(messages(log_file.read_text())) == ours


def same_params(a, b):
    return a.keys() == b.keys() and all(
        a[n][1] == b[n][1] and np.array_equal(a[n][0], b[n][0]) for n in a)


def test_same_seed_gives_identical_runs_and_no_seed_differs(fixture_job, run_driver, tmp_path):
    def run(name, head=""):
        conf = fixture_job(f"{name}.conf", workspace=tmp_path / name, head=head)
        r = run_driver(conf)
        assert r.returncode == 0, r.stderr
        snap = tmp_path / name / "checkpoint" / "step200-worker0.bin"
        c = CheckpointReader(str(snap))
        return metrics(messages(r.stderr)), {n: (c.param(n), c.version(n)) for n in c.names}

    a_log, a_params = run("a", "seed: 42\n")
    b_log, b_params = run("b", "seed: 42\n")
    assert a_log == b_log
    assert same_params(a_params, b_params)
    c_log, c_params = run("c")
    assert c_log != a_log
    assert not same_params(c_params, a_params)


def test_mnist_example_conf_learns_and_its_checkpoint_tests(run_driver, tmp_path, mnist_data):
    """SINGA's examples/mnist/job.conf, unmodified, 1000 steps on Fashion-MNIST (~2 min)."""
    made_dirs = [d for d in ("checkpoint", "visualization") if not os.path.isdir(os.path.join(MNIST, d))]
    try:
        r = run_driver(os.path.join(MNIST, "job.conf"), timeout=1800)
        assert r.returncode == 0, r.stderr
        ours = metrics(messages(r.stderr))
        losses = [loss for k, _, loss, _ in ours if k == "Train"]
        assert len(losses) == 100
        assert np.mean(losses[-5:]) < np.mean(losses[:5])
        assert max(acc for k, _, _, acc in ours if k == "Test") >= 0.78

        final = os.path.join(MNIST, "checkpoint", "step1000-worker0.bin")
        with open(os.path.join(MNIST, "job.conf")) as f:
            text = f.read()
        assert "test_steps:10\n" in text
        conf = tmp_path / "mnist-test.conf"
        conf.write_text(text.replace("test_steps:10\n", f'test_steps: 100\ncheckpoint_path: "{final}"\n'))
        r = run_driver(conf, "-test", timeout=600)
        assert r.returncode == 0, r.stderr
        (kind, _, _, acc), = metrics(messages(r.stderr))
        assert kind == "Test" and acc >= 0.78
    finally:
        for d in made_dirs:
            shutil.rmtree(os.path.join(MNIST, d), ignore_errors=True)
