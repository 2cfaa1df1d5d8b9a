"""singa.api.session: one-process jobs in the calling process, no ZooKeeper; numpy data; predict;
Ctrl-C; the caller's logging and signal handlers kept."""
import logging
import os
import signal
import subprocess
import textwrap
import time

import numpy as np
import pytest
from google.protobuf import text_format

import singa
from conftest import fixture_proto
from singa import checkpoint
from singa.api import session
from singa.errors import ConfigError
from singa.io import memory
from singa.io.kvfile import KVFile
from singa.io.records import class_indices, decode_batch

FIXTURES = os.path.join(singa.HOME, "tests", "fixtures", "singa-0.3")
PYTHON = os.path.join(singa.HOME, ".venv", "bin", "python")


def read_records(path):
    with KVFile(path) as f:
        values = [v for _, v in f]
    return decode_batch(values, 784)


def test_numpy_data_gives_the_kvfile_batches_and_the_same_losses(tmp_path):
    x, y = read_records(os.path.join(FIXTURES, "train-1000.bin"))
    runs = []
    for name, numpy_data in (("kvfile", False), ("numpy", True)):
        job = fixture_proto(tmp_path / name, train_steps=60, disp_freq=10, seed=7,
                          checkpoint_freq=0, test_steps=0)
        job.neuralnet.layer[0].store_conf.random_skip = 300
        if numpy_data:
            sc = job.neuralnet.layer[0].store_conf
            sc.backend, sc.path = "memory", memory.register(x.astype(np.uint8), y)
        runs.append(session.train(session.prepare(job), progress=False))
    kv, mem = runs
    assert [s for s, _ in kv["train"]] == list(range(0, 60, 10))
    assert kv["train"] == mem["train"]       # same batches, skip and preprocessing: same floats
    assert kv["train"][-1][1]["loss"] < kv["train"][0][1]["loss"]
    a, b = (checkpoint.CheckpointReader(h.snapshots[-1][1]) for h in runs)
    assert all(np.array_equal(a.param(n), b.param(n)) for n in a.names)


def test_predict_equals_a_forward_pass_computed_here(tmp_path):
    job = session.prepare(fixture_proto(tmp_path / "ws", train_steps=30, checkpoint_freq=0,
                                      test_steps=0, seed=3))
    history = session.train(job, progress=False)
    path = history.snapshots[-1][1]
    x, _ = read_records(os.path.join(FIXTURES, "test-500.bin"))
    x = x[:300].astype(np.uint8)            # two batches of 256, the second wrapping around
    job.checkpoint_path.append(path)
    p = session.predict(job, x)
    params = checkpoint.CheckpointReader(path)
    w1, b1, w2, b2 = (params.param(f"0#{n}").astype(np.float64)
                      for n in ("weight1", "bias1", "weight2", "bias2"))
    h = 1 / (1 + np.exp(-(x / 255.0 @ w1.T + b1)))
    z = h @ w2.T + b2
    want = np.exp(z - z.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    assert p.shape == (300, 10)
    np.testing.assert_allclose(p, want, rtol=1e-4, atol=1e-6)


RUN_WITHOUT_ZOOKEEPER = textwrap.dedent("""
    import socket, subprocess, sys
    events = []
    def audit(event, args):
        if event in ("socket.connect", "subprocess.Popen", "os.fork", "os.exec", "os.posix_spawn"):
            events.append((event, repr(args)[:80]))
    sys.addaudithook(audit)
    from singa.api import session
    from singa.job import config
    job = config.parse_job(open(sys.argv[1]).read(), sys.argv[1])
    h = session.train(session.prepare(job), progress=False)
    print("EVENTS", events)
    print("LAST", h.last("test"))
""")


def test_a_one_process_job_opens_no_connection_and_starts_no_process(tmp_path):
    job = fixture_proto(tmp_path / "ws", train_steps=40, test_freq=20)
    conf = tmp_path / "job.conf"
    conf.write_text(text_format.MessageToString(job))
    env = dict(os.environ, PYTHONPATH=singa.HOME)
    run = subprocess.run([PYTHON, "-c", RUN_WITHOUT_ZOOKEEPER, str(conf)], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    assert "EVENTS []" in run.stdout, run.stdout
    assert "'accuracy'" in run.stdout
    assert os.path.exists(tmp_path / "ws" / "checkpoint" / "step40-worker0.bin")


INTERRUPTED = textwrap.dedent("""
    import logging, signal, sys
    # a terminal's Ctrl-C (a run in the background inherits SIGINT ignored, which train keeps)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from singa import checkpoint
    from singa.api import session
    from singa.job import config
    mine = logging.StreamHandler(sys.stdout)
    logging.getLogger("singa").addHandler(mine)
    job = config.parse_job(open(sys.argv[1]).read(), sys.argv[1])
    print("READY", flush=True)
    h = session.train(session.prepare(job), progress=False)
    print("STOPPED_BY", h.stopped_by, h.snapshots[-1][0], flush=True)
    try:
        session.deliver(h.stopped_by)
        print("NOT INTERRUPTED")
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
    print("HANDLER", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    print("LOGGING", logging.getLogger("singa").handlers == [mine])
    snap = checkpoint.latest_snapshot(job.cluster.workspace + "/checkpoint")
    print("SNAPSHOT", snap.step, snap.complete)
    job.train_steps = snap.step + 20
    h = session.train(session.prepare(job), resume=True, progress=False)
    print("AGAIN", h["train"][0][0], flush=True)
""")


def test_sigint_stops_training_after_a_snapshot_and_keeps_the_callers_handlers(tmp_path):
    job = fixture_proto(tmp_path / "ws", train_steps=100000, checkpoint_freq=20, test_steps=0)
    conf = tmp_path / "job.conf"
    conf.write_text(text_format.MessageToString(job))
    proc = subprocess.Popen([PYTHON, "-c", INTERRUPTED, str(conf)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=singa.HOME))
    deadline = time.monotonic() + 120
    while not (tmp_path / "ws" / "checkpoint" / "step40-worker0.bin").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert "INTERRUPTED" in lines and "NOT INTERRUPTED" not in lines, out
    assert "HANDLER True" in lines and "LOGGING True" in lines
    step, complete = next(line.split()[1:] for line in lines if line.startswith("SNAPSHOT"))
    assert complete == "True" and int(step) >= 40
    assert f"STOPPED_BY {int(signal.SIGINT)} {step}" in lines   # a snapshot where it stopped
    # resumed at the snapshot; displays every 20 steps
    assert f"AGAIN {-(-int(step) // 20) * 20}" in lines, out
    assert "SIGINT: a snapshot in a step or two, then the job stops" in err  # warnings too


def test_the_job_log_goes_to_the_workspace_and_info_stays_off_the_console(tmp_path, capsys):
    logger = logging.getLogger("singa")
    before = logger.handlers[:], logger.level, logger.propagate
    job = session.prepare(fixture_proto(tmp_path / "ws", train_steps=20, test_steps=0,
                                      checkpoint_freq=0))
    session.train(job, progress=False)
    assert (logger.handlers[:], logger.level, logger.propagate) == before
    log = (tmp_path / "ws" / "fixture-mlp.log").read_text()
    assert "Train @ step 0  Loss = " in log
    assert "Train @ step" not in capsys.readouterr().err


def test_bad_numpy_data_is_one_line():
    with pytest.raises(ConfigError, match="3 labels for 2 samples"):
        memory.register(np.zeros((2, 4)), [1, 2, 3])
    with pytest.raises(ConfigError, match="3 targets for 2 samples"):
        memory.register(np.zeros((2, 4)), [0.5, 1, 2])     # floats: regression targets
    with pytest.raises(ConfigError, match="labels y must be integers"):
        class_indices(np.array([0.5, 1]), 2)


def test_a_python_script_runs_under_singa_run_exec(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import sys\nprint('ARGS', sys.argv[1:])\nimport os\nprint('CWD', os.getcwd())\n")
    run = subprocess.run(["bash", os.path.join(singa.HOME, "bin", "singa-run.sh"), "-exec",
                          str(script), "-x", "1"], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "ARGS ['-x', '1']" in run.stdout
    assert f"CWD {singa.HOME}" in run.stdout


def test_a_job_of_two_processes_runs_through_the_launcher_and_returns_its_history(
        tmp_path, singa_conf, monkeypatch):
    """Two worker processes (ZooKeeper of the tests, conf/hostfile: localhost); numpy data
    reaches them as a kvfile in the workspace; the History comes from metrics.csv."""
    x, y = read_records(os.path.join(FIXTURES, "train-1000.bin"))
    job = fixture_proto(tmp_path / "ws", train_steps=40, disp_freq=10, checkpoint_freq=20,
                      test_freq=20, seed=5)
    job.cluster.nworkers_per_group, job.cluster.nworkers_per_procs = 2, 1
    sc = job.neuralnet.layer[0].store_conf
    sc.backend, sc.path = "memory", memory.register(x.astype(np.uint8), y)
    monkeypatch.setenv("SINGA_CONF", str(singa_conf.parent))
    history = session.train(session.prepare(job), progress=False)
    assert [s for s, _ in history["train"]] == [0, 10, 20, 30]
    assert [s for s, _ in history["test"]] == [0, 20]
    assert set(history.last("test")) == {"loss", "accuracy"}
    assert [s for s, _ in history.snapshots] == [0, 20, 40]
    assert os.path.exists(tmp_path / "ws" / "data-train.bin")


def test_a_job_of_two_processes_restarted_whole_returns_the_history_of_every_run(
        tmp_path, singa_conf, monkeypatch):
    """max_restarts: process 1 killed mid-job, the launcher restarts the job from its newest
    snapshot under a new job id; the History holds every step of both runs (the bug: the last
    run's only, from the resumed step), and the callbacks hear the restart's events too."""
    job = fixture_proto(tmp_path / "ws", train_steps=3000, disp_freq=100,
                        checkpoint_freq=500, test_freq=0, max_restarts=1, seed=5)
    job.cluster.nworkers_per_group, job.cluster.nworkers_per_procs = 2, 1
    monkeypatch.setenv("SINGA_CONF", str(singa_conf.parent))
    heard, killed = [], []

    def on_event(step, phase, values):
        heard.append(step)
        if step >= 1000 and not killed:
            pids = subprocess.run(["pgrep", "-f", f"singa.driver .*{tmp_path}.*-procs_id 1"],
                                  capture_output=True, text=True).stdout.split()
            killed.extend(pids)
            for pid in pids:
                os.kill(int(pid), signal.SIGKILL)
    history = session.train(session.prepare(job), progress=False, on_event=on_event)
    assert len(killed) == 1
    assert [s for s, _ in history["train"]] == list(range(0, 3000, 100)), history["train"]
    assert heard[-1] == 2900 and sorted(set(heard)) == list(range(0, 3000, 100)), heard
    assert len(heard) > 30      # the restart's run from its snapshot, heard again


def test_a_model_of_two_processes_uses_the_zookeeper_its_cluster_names(tmp_path, zk_server,
                                                                       monkeypatch):
    """Cluster(zookeeper_host=...): the launcher reads a conf folder in the workspace naming
    it, with the SINGA home's hostfile; conf/singa.conf's ZooKeeper is never asked."""
    from singa.callbacks import LambdaCallback
    from singa.model import Cluster, Dense, Sequential
    monkeypatch.delenv("SINGA_CONF", raising=False)
    x, y = read_records(os.path.join(FIXTURES, "train-1000.bin"))
    m = Sequential('two')
    m.add(Dense(16, init='uniform', activation='tanh'))
    m.add(Dense(10, init='uniform', activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer='sgd',
              cluster=Cluster(str(tmp_path / "ws"), nworkers_per_group=2, nworkers_per_procs=1,
                              zookeeper_host=zk_server))
    h = m.fit(x, y, nb_epoch=20, seed=1, progress=False)
    assert h.snapshots[-1][0] == 20 and [s for s, _ in h["train"]] == [0, 2, 4, 6, 8, 10, 12,
                                                                       14, 16, 18]
    conf = (tmp_path / "ws" / "conf" / "singa.conf").read_text()
    assert f'zookeeper_host: "{zk_server}"' in conf
    # callbacks hear the launched job's metrics.csv; a stop is a snapshot, then exit
    seen = []
    stop = LambdaCallback(on_step_end=lambda step, metrics: seen.append(step) or step >= 40)
    h = m.fit(x, y, nb_epoch=3000, disp_freq=10, seed=1, progress=False, callbacks=[stop])
    assert seen[0] == 20 and 40 < h.snapshots[-1][0] < 3020, (seen[:5], h.snapshots)
    with pytest.raises(ConfigError, match="'nworkers' is no ClusterProto field"):
        Cluster(str(tmp_path), nworkers=2)
