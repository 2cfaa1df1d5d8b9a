"""The `singa` process's lifecycle: signals, a lost ZooKeeper, its hold on the workspace,
retention over the whole workspace, and the check-only mode singa-run.sh runs first."""
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import (FIXTURES, PYTHON, free_port, new_job, scaled_records, start_drivers,
                      zk_service)
from singa import checkpoint
from singa.cluster.job_manager import JobManager
from singa.cluster.zk import ZKService
from singa.comm.trust import ENV, new_secret
from singa.io import write_records
from singa.proto import job_pb2

LONG = {"train_steps": 1_000_000, "test_freq": 0, "checkpoint_freq": 0, "disp_freq": 100}


def wait_for(path, text, proc, timeout=120):
    """Wait until `text` is in the file at `path` while `proc` runs; the file's content."""
    deadline = time.monotonic() + timeout
    while True:
        content = open(path).read() if os.path.exists(path) else ""
        if text in content:
            return content
        assert proc.poll() is None, f"the driver ended before {text!r}:\n{content[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout} s:\n{content[-3000:]}"
        time.sleep(0.05)


@pytest.fixture
def stop_after(singa_popen):
    """stop_after(conf, text, stop, *flags): run the driver until its log shows `text`, call
    stop(proc), then return (exit status, log); a driver that hangs fails the test."""
    procs = []

    def run(conf, text, stop, *flags):
        proc = singa_popen(conf, *flags)
        procs.append(proc)
        wait_for(f"{conf}.log", text, proc)
        stop(proc)
        try:
            status = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the driver still runs 60 s later:\n{open(f'{conf}.log').read()[-3000:]}")
        return status, open(f"{conf}.log").read()
    yield run
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_stops_the_driver_with_its_znodes_and_the_newest_snapshot_intact(
        sig, mlp_job, stop_after, zk_server, tmp_path):
    folder = tmp_path / "ws" / "checkpoint"
    conf = mlp_job(**dict(LONG, checkpoint_freq=50))
    status, log = stop_after(conf, "checkpoint to", lambda p: p.send_signal(sig))
    assert status == 128 + sig, log
    assert f"singa: stopped by {signal.Signals(sig).name}" in log
    assert "Traceback" not in log
    job_id = int(re.search(r"Record job log to .*/(\d+)-", log)[1])
    with ZKService(zk_server) as zk:
        assert JobManager(zk).job_procs(job_id) == []
    assert not [n for n in os.listdir(folder) if ".tmp-" in n]
    snap = checkpoint.latest_snapshot(str(folder))
    assert snap.complete and snap.step % 50 == 0
    assert checkpoint.CheckpointReader(snap.files[0]).step == snap.step


@pytest.fixture
def own_zookeeper(tmp_path):
    """A ZooKeeper server this test may stop: (singa.conf naming it, stop())."""
    env = dict(os.environ, ZK_PORT=str(free_port()), ZK_DATA=str(tmp_path / "zk"),
               SINGA_MANAGES_ZK="true")
    zk_service("start", env)
    conf = tmp_path / "own-singa.conf"
    conf.write_text(f'zookeeper_host: "127.0.0.1:{env["ZK_PORT"]}"\nlog_dir: "{tmp_path}/log/"\n')

    def stop(*_):
        zk_service("stop", env)
    yield conf, stop
    stop()


def test_sighup_to_one_process_is_a_stop_the_others_name(mlp_job, singa_conf, zk_server, tmp_path):
    """A terminal hangup to one process of a job is handled like SIGTERM: it stops with exit
    129 and its mark in ZooKeeper, so the other process stops at once naming the signal (not
    'was lost', nor 120 s later)."""
    conf = mlp_job(**dict(LONG, checkpoint_freq=0), edit=lambda job: (
        setattr(job.cluster, "nworkers_per_group", 2),
        setattr(job.cluster, "nservers_per_group", 2)))     # a worker and a server in each
    logs = [tmp_path / f"hup{i}.log" for i in range(2)]
    job_id, env, _ = new_job(zk_server)
    procs = start_drivers(conf, singa_conf, job_id, env, logs)
    try:
        deadline = time.monotonic() + 120
        while "Train @ step 100" not in "".join(log.read_text() for log in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        procs[0].send_signal(signal.SIGHUP)
        hung_up = time.monotonic()
        status = [p.wait(timeout=60) for p in procs]
        took = time.monotonic() - hung_up
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    texts = [log.read_text() for log in logs]
    assert status[0] == 128 + signal.SIGHUP and "singa: stopped by SIGHUP" in texts[0], texts[0]
    assert status[1] != 0 and re.search(r"process \d of job \d+ \(.*\) was stopped by SIGHUP",
                                        texts[1]), texts[1]
    assert "Traceback" not in "".join(texts) and took < 20, (took, texts)


def test_a_process_stopped_by_an_error_is_named_failed_with_it_by_the_others(
        mlp_job, singa_conf, zk_server, tmp_path):
    """Process 1's worker reads the second half of each batch, where a label is out of range:
    it stops with that DataError, and process 0 stops naming it (not 'was lost')."""
    x, y = scaled_records(os.path.join(FIXTURES, "train-1000.bin"))
    y = y.copy()
    y[40] = 99                      # batch 0 of 50, rows 25..49: process 1's worker
    write_records(str(tmp_path / "bad.bin"), x[:200] * 255, y[:200])

    def edit(job):
        job.cluster.nworkers_per_group = job.cluster.nservers_per_group = 2
        for layer in job.neuralnet.layer:
            if layer.type == job_pb2.kRecordInput and job_pb2.kTrain in layer.include:
                layer.store_conf.path = str(tmp_path / "bad.bin")
                layer.store_conf.random_skip = 0
    conf = mlp_job(**dict(LONG, checkpoint_freq=0), edit=edit)
    logs = [tmp_path / f"fail{i}.log" for i in range(2)]
    job_id, env, _ = new_job(zk_server)
    procs = start_drivers(conf, singa_conf, job_id, env, logs)
    try:
        status = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    texts = [log.read_text() for log in logs]
    why = "label 99 from source"
    assert status[1] == 2 and why in texts[1], texts[1]
    assert status[0] != 0 and re.search(rf"process 1 of job {job_id} \(.*\) failed: .*{why}",
                                        texts[0]), texts[0]
    assert "was lost" not in texts[0] and "Traceback" not in "".join(texts)


def test_driver_ends_with_a_warning_when_zookeeper_stops_mid_run(mlp_job, own_zookeeper, tmp_path):
    singa_conf, stop_zookeeper = own_zookeeper
    conf = mlp_job(train_steps=4000, test_freq=0, checkpoint_freq=0, disp_freq=100)
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([PYTHON, "-m", "singa.driver", "-conf", str(conf),
                                 "-singa_conf", str(singa_conf)], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(log, "Train @ step 100", proc)
        stop_zookeeper()
        status = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the driver hangs after ZooKeeper stopped:\n{log.read_text()[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    text = log.read_text()
    assert status == 0, text
    assert "Train @ step 3900" in text      # ZooKeeper stopped while it trained
    assert re.search(r"^W.*Worker \(group = 0, id = 0\).*ZooKeeper at 127\.0\.0\.1:\d+", text,
                     re.M), text
    assert "Traceback" not in text
    assert (tmp_path / "ws" / "checkpoint" / "step4000-worker0.bin").is_file()


def test_second_job_on_a_busy_workspace_is_refused_naming_the_first(mlp_job, stop_after,
                                                                    run_driver):
    first = mlp_job("first", **LONG)

    def second_job(proc):
        r = run_driver(mlp_job("second", train_steps=10, test_freq=0, checkpoint_freq=0))
        second_job.result = r
        proc.terminate()
    _, log = stop_after(first, "Train @ step 0", second_job)
    job_id = re.search(r"Record job log to .*/(\d+)-", log)[1]
    pid = re.search(r"\(pid = (\d+)\)", log)[1]
    r = second_job.result
    assert r.returncode == 2, r.stderr
    line, = [x for x in r.stderr.splitlines() if x.startswith("singa: ")]
    assert "workspace" in line and f"job {job_id}" in line and f"pid {pid}" in line, line
    assert "Train @" not in r.stderr


def test_retention_covers_snapshots_of_earlier_runs(mlp_job, run_driver, tmp_path):
    folder = tmp_path / "ws" / "checkpoint"
    first = mlp_job("first", train_steps=50, test_freq=0, checkpoint_freq=10, disp_freq=0)
    assert run_driver(first).returncode == 0
    resumed = mlp_job("resumed", train_steps=80, test_freq=0, checkpoint_freq=10, disp_freq=0,
                      checkpoint_keep_newest=2)
    r = run_driver(resumed, "-resume")
    assert r.returncode == 0, r.stderr
    assert "Resume from step 50" in r.stderr
    assert [s.step for s in checkpoint.list_snapshots(str(folder))] == [70, 80]


def test_check_mode_validates_without_running(mlp_job, run_driver, singa_conf, zk_server):
    many = len(os.sched_getaffinity(0)) * 4 + 1    # more than this host's cores run sensibly

    def spread(job):
        job.cluster.nworkers_per_group = many
        job.cluster.nworkers_per_procs = 1
    conf = mlp_job(edit=spread)
    r = run_driver(conf, "-check")
    line, = r.stderr.splitlines()
    assert r.returncode == 2
    assert line.startswith("singa: cluster: ") and f"{many} processes" in line, line
    assert "-oversubscribe" in line
    with ZKService(zk_server) as zk:
        ids = JobManager(zk).list_jobs(all=True)
    r = run_driver(conf, "-check", "-oversubscribe")
    assert r.returncode == 0, r.stderr
    assert "Train @" not in r.stderr and "proc #" not in r.stderr
    with ZKService(zk_server) as zk:
        assert JobManager(zk).list_jobs(all=True) == ids        # nothing registered, no job id taken


def test_a_job_of_several_processes_ends_when_zookeeper_stops_mid_run(mlp_job, own_zookeeper,
                                                                      tmp_path):
    """Sandblaster in 3 processes: the server process learns by messages (the workers'
    farewells) that its workers are done, so the job ends without ZooKeeper."""
    singa_conf, stop_zookeeper = own_zookeeper
    conf = mlp_job(train_steps=3000, test_freq=0, checkpoint_freq=0, disp_freq=100,
                   edit=lambda job: (setattr(job.cluster, "nworkers_per_group", 2),
                                     setattr(job.cluster, "server_worker_separate", True)))
    logs = [tmp_path / f"run{i}.log" for i in range(3)]
    env = dict(os.environ, **{ENV: new_secret()})      # the job's secret, as singa-run.sh's
    procs = start_drivers(conf, singa_conf, 7, env, logs)
    try:
        deadline = time.monotonic() + 120
        while "Train @ step 100" not in "".join(log.read_text() for log in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        stop_zookeeper()
        status = [p.wait(timeout=120) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail("a process hangs after ZooKeeper stopped:\n" +
                    "\n".join(log.read_text()[-2000:] for log in logs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    text = "\n".join(log.read_text() for log in logs)
    assert status == [0, 0, 0], text
    assert "Train @ step 2900" in text and "every worker has left" in text
    assert "Traceback" not in text
    for w in (0, 1):
        assert (tmp_path / "ws" / "checkpoint" / f"step3000-worker{w}.bin").is_file()


def test_zookeeper_gone_and_a_downpour_worker_process_killed_the_others_stop_naming_it(
        mlp_job, own_zookeeper, tmp_path):
    """Downpour (two worker groups, their server group in a process of its own): ZooKeeper
    stops, then one worker process is killed. Nothing can tell the others through ZooKeeper,
    and the other group's worker keeps its server busy (never silent for
    SINGA_SILENCE_TIMEOUT): both notice the dropped connection and stop with one line naming
    the killed process, instead of training on to the end."""
    singa_conf, stop_zookeeper = own_zookeeper
    conf = mlp_job(**LONG, edit=lambda job: (setattr(job.cluster, "nworker_groups", 2),
                                             setattr(job.cluster, "server_worker_separate", True)))
    logs = [tmp_path / f"run{i}.log" for i in range(3)]
    procs = start_drivers(conf, singa_conf, 9, dict(os.environ, **{ENV: new_secret()}), logs)
    try:
        deadline = time.monotonic() + 120
        while "Train @ step 100" not in "".join(log.read_text() for log in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        stop_zookeeper()
        victim = [p for p, log in zip(procs, logs) if "Worker (group" in log.read_text()][-1]
        victim.kill()
        status = [p.wait(timeout=60) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail("a process trains on:\n" + "\n".join(log.read_text()[-2000:] for log in logs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert sorted(status) == [-9, 1, 1], status
    for p, log in zip(procs, logs):
        if p is victim:
            continue
        text = log.read_text()
        assert re.search(rf"No connection to process \d at 127\.0\.0\.1:\d+ for 1 s", text), text
        line = text.strip().splitlines()[-1]
        assert re.fullmatch(rf"singa: process \d of job 9 \(127\.0\.0\.1:\d+, pid {victim.pid}\) "
                            rf"was lost", line), text
        assert "Traceback" not in text
