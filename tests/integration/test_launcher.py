"""bin/singa-run.sh through faults of ZooKeeper: processes started over ssh (a stand-in that
runs them here, test_scripts.FAKE_SSH) on a ZooKeeper server this test stops and starts."""
import os
import re
import shlex
import signal
import subprocess
import time

import pytest

import singa
from conftest import FAKE_SSH, free_port, zk_service

BIN = os.path.join(singa.HOME, "bin")


def kill_orphans(log):
    """SIGKILL to the drivers the launch's output shows that still run (the fake ssh starts
    them in sessions of their own: a closed ssh leaves them training)."""
    for pid in re.findall(r"\(pid = (\d+)\)", log.read_text()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"singa.driver" in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            pass


@pytest.fixture
def outage_env(tmp_path):
    """(environment for bin/ scripts whose hostfile names one remote host, 127.0.0.1, reached
    through a fake ssh; service(cmd): zk-service.sh start|stop of its own ZooKeeper)."""
    zk_env = dict(os.environ, ZK_PORT=str(free_port()), ZK_DATA=str(tmp_path / "zk"),
                  SINGA_MANAGES_ZK="true")

    def service(cmd):
        zk_service(cmd, zk_env)
    service("start")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "hostfile").write_text("127.0.0.1\n")
    (conf / "singa.conf").write_text(f'zookeeper_host: "127.0.0.1:{zk_env["ZK_PORT"]}"\n'
                                     f'log_dir: "{tmp_path / "log"}/"\n')
    bindir = tmp_path / "fake bin"
    bindir.mkdir()
    ssh = bindir / "ssh"
    ssh.write_text(FAKE_SSH.format(log=shlex.quote(str(tmp_path / "ssh.log"))))
    ssh.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SINGA_") and k != "PYTHON"}
    env.update(SINGA_CONF=str(conf), PATH=f"{bindir}:{env['PATH']}")
    try:
        yield env, service
    finally:
        zk_service("stop", zk_env, check=False)


def train_over_ssh(fixture_job, env, tmp_path):
    """(Popen, log path) of bin/singa-run.sh training the fixture MLP on and on in two
    processes started over the fake ssh, once both run and step 100 is displayed."""
    conf = fixture_job(edits={
        "cluster { nworker_groups: 1 nserver_groups: 1":
            "cluster { nworker_groups: 1 nserver_groups: 1 nworkers_per_group: 2 "
            "nservers_per_group: 2",
        "train_steps: 200": "train_steps: 1000000", "test_freq: 100": "test_freq: 0",
        "checkpoint_freq: 100": "checkpoint_freq: 0", "disp_freq: 20": "disp_freq: 100"})
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        run = subprocess.Popen([os.path.join(BIN, "singa-run.sh"), "-conf", str(conf)], env=env,
                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    try:
        while len(re.findall(r"proc #\d", log.read_text())) < 2 or \
                "Train @ step 100 " not in log.read_text():
            assert time.monotonic() < deadline and run.poll() is None, log.read_text()
            time.sleep(0.2)
    except BaseException:
        end_launch(run, log)
        raise
    return run, log


def end_launch(run, log):
    """SIGKILL to the launch and to its drivers, where they still run."""
    if run.poll() is None:
        os.killpg(run.pid, signal.SIGKILL)
    kill_orphans(log)


def stop_after_snapshot(run, log, tmp_path):
    """SIGUSR1 to the launch: it exits 138 after one stop with a snapshot, whose files every
    worker wrote, every process's status known."""
    try:
        run.send_signal(signal.SIGUSR1)
        rc = run.wait(timeout=120)
    finally:
        end_launch(run, log)
    text = log.read_text()
    assert rc == 128 + signal.SIGUSR1, text
    assert "lost host" not in text and "closing it" not in text and "Traceback" not in text, text
    assert text.count("stopped by SIGUSR1 after a snapshot") == 1, text
    step = int(re.search(r"stopping at step (\d+) after a snapshot", text)[1])
    for w in (0, 1):
        assert (tmp_path / "ws" / "checkpoint" / f"step{step}-worker{w}.bin").is_file(), text


def test_a_zookeeper_outage_does_not_end_a_launch_over_ssh(fixture_job, outage_env, tmp_path):
    """ZooKeeper stops for 20 s while two processes started over ssh train: the launcher's
    watcher rides it through (before: it took its failure for 'every process has left', closed
    the ssh sessions after 5 s and reported the host lost). After ZooKeeper is back the job
    trains on and stops as asked (SIGUSR1: a snapshot, then exit 138), every process's status
    known."""
    env, service = outage_env
    run, log = train_over_ssh(fixture_job, env, tmp_path)
    try:
        service("stop")
        time.sleep(20)
        service("start")
        back = len(log.read_text())
        time.sleep(15)      # past the moment the old watcher ended the launch
        assert run.poll() is None, log.read_text()
        assert "Train @ step" in log.read_text()[back:], log.read_text()    # trains on
    except BaseException:
        end_launch(run, log)
        raise
    stop_after_snapshot(run, log, tmp_path)


def test_sigusr1_while_zookeeper_is_away_stops_the_job_after_a_snapshot(fixture_job, outage_env,
                                                                        tmp_path):
    """SIGUSR1 to a launch over ssh while ZooKeeper is away: the launcher cannot read which
    processes registered, so it asks the first of job.pids (complete once all had) for the
    snapshot, and the job stops after it (before: the failed read ended the launcher under
    set -e, which killed the job without a snapshot)."""
    env, service = outage_env
    run, log = train_over_ssh(fixture_job, env, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while len(pids := list((tmp_path / "log" / "job-info").glob("job-*/job.pids"))) != 1 \
                or len(pids[0].read_text().splitlines()) < 2:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        service("stop")
    except BaseException:
        end_launch(run, log)
        raise
    stop_after_snapshot(run, log, tmp_path)
