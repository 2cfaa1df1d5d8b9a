"""Elastic asynchronous groups (issue 31): bin/singa-run.sh restarts a lost worker-only process
of a Downpour or Hogwild job alone; its groups join the running job again. Real processes, a
real ZooKeeper, the fixture MLP on real data. A lost process holding servers restarts the
whole job (test_scripts)."""
import csv
import os
import re
import signal
import subprocess
import time

import pytest

import singa
from conftest import finish, job_process, launch, wait_for, zookeeper

BIN = os.path.join(singa.HOME, "bin")
# plain SGD (asynchronous groups and momentum: see test_distributed)
EDITS = {"momentum: 0.9 learning_rate { type: kFixed base_lr: 0.05 }":
         "learning_rate { type: kFixed base_lr: 0.5 }",
         "test_freq: 100": "test_freq: 200", "checkpoint_freq: 100": "checkpoint_freq: 200"}


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory):
    """This module's own ZooKeeper: it lists jobs."""
    yield from zookeeper(tmp_path_factory)


# Steps of the job, and the interval of its tests and snapshots. Group 0 may end before the
# killed process rejoins (the fixture MLP trains 1,260 steps a second on an idle 2-core one,
# and a restart takes some 8 s): the servers wait for its group, which trains to the end.
LONG, EVERY = 8000, 2000


def test_a_killed_downpour_worker_process_rejoins_and_the_job_ends_well(fixture_job, env,
                                                                        tmp_path):
    """SINGA's Downpour layout: process 0 holds the servers and group 0, process 1 group 1.
    kill -9 of process 1: the launcher restarts it alone, its group takes the servers'
    current params (its first batch after the rejoin, at the step of the newest snapshot, is
    scored as a trained net, and group 0's tests never fall back), the job ends with exit 0
    and `singa-console.sh list` shows the restart meanwhile."""
    conf = fixture_job(head="max_restarts: 1\n", edits={
        **EDITS, "cluster { nworker_groups: 1": "cluster { nworker_groups: 2",
        "train_steps: 200": f"train_steps: {LONG}", "test_freq: 100": f"test_freq: {EVERY}",
        "checkpoint_freq: 100": f"checkpoint_freq: {EVERY}", "disp_freq: 20": "disp_freq: 200"})
    log = tmp_path / "run.log"
    run = launch(conf, env, log)
    wait_for(run, log, f"Test @ step {EVERY}")
    killed, at = job_process(run, 1), time.time()
    os.kill(killed, signal.SIGKILL)
    wait_for(run, log, "Process 1 rejoined the job")
    listed = subprocess.run([os.path.join(BIN, "singa-console.sh"), "list"], env=env,
                            capture_output=True, text=True).stdout
    rc, text = finish(run, log)
    assert rc == 0, text
    assert re.search(r"singa-run: job \d+: process 1 failed \(exit 137\); restart 1 of 1: it "
                     r"rejoins the running job", text), text
    assert re.search(rf"process 1 of job \d+ \(127\.0\.0\.1:\d+, pid {killed}\) was lost: its "
                     rf"worker groups leave at step \d+; the job goes on", text), text
    assert re.search(r"^JOB ID    \|NUM PROCS \|RESTARTS\n.*\n\d+ +\|\d+ +\|1$", listed, re.M), \
        listed
    with open(tmp_path / "ws" / "metrics.csv") as f:   # the log interleaves the processes'
        rows = [row for row in csv.DictReader(f) if row["metric"] == "accuracy"]
    tests = [(int(r["step"]), float(r["value"])) for r in rows
             if r["group"] == "0" and r["phase"] == "test"]
    assert [s for s, _ in tests] == list(range(0, LONG, EVERY)), tests
    assert min(a for _, a in tests[1:]) > 0.6 and tests[-1][1] > 0.75, tests   # never reset
    resumed = int(re.search(r"Process 1 rejoins job \d+ at step (\d+)", text)[1])
    rows = [r for r in rows if r["group"] == "1" and r["phase"] == "train" and
            float(r["wall_time"]) > at]
    assert int(rows[0]["step"]) == resumed and float(rows[0]["value"]) > 0.6, rows[:3]
    assert int(rows[-1]["step"]) == LONG - 200
    assert (tmp_path / "ws" / "checkpoint" / f"step{LONG}-worker0.bin").is_file()


# Steps of a job whose process 1 stops at the test of step SHORT_EVERY, and how long a short
# freeze lasts (past the others' notice of a lost connection, within the ZooKeeper session).
# Group 0 may end before process 1 rejoins (a restart takes some 5 s; a process frozen for good
# is killed SESSION_TIMEOUT and 2 s after its freeze): its servers wait for it.
SHORT, SHORT_EVERY, FREEZE = 3000, 1000, 5


# SIGINT and SIGHUP take SIGTERM's path (Driver.on_signal, stub.stop)
@pytest.mark.parametrize("stop", ["SIGTERM", "freeze", "frozen"])
def test_a_downpour_worker_process_stopped_cleanly_rejoins_and_trains_to_the_end(
        fixture_job, env, tmp_path, stop):
    """SIGTERM of process 1 of SINGA's Downpour layout, a short freeze of it (SIGSTOP, then
    SIGCONT 5 s later: the others took it for lost, ZooKeeper did not) or a freeze for good:
    its workers say no farewell to the servers (they did not finish); woken, it learns that it
    was taken for lost and stops; frozen for good, the launcher kills it once its ZooKeeper
    session has ended. The launcher's restart of it rejoins and its group 1 trains to the end,
    with group 0 or after it; the job ends with exit 0 and no whole-job restart. (The bugs: the
    servers counted group 1 out for good on its farewell, ended with group 0, and the rejoined
    group waited for them 120 s and failed; woken from a short freeze it trained on ignored,
    and the job restarted whole 60 s later; frozen for good, likewise.)"""
    conf = fixture_job(head="max_restarts: 1\n", edits={
        **EDITS, "cluster { nworker_groups: 1": "cluster { nworker_groups: 2",
        "train_steps: 200": f"train_steps: {SHORT}", "test_freq: 100": f"test_freq: {SHORT_EVERY}",
        "checkpoint_freq: 100": f"checkpoint_freq: {SHORT_EVERY // 2}",
        "disp_freq: 20": "disp_freq: 200"})
    log = tmp_path / "run.log"
    run = launch(conf, env, log)
    wait_for(run, log, f"Test @ step {SHORT_EVERY}")
    stopped, at = job_process(run, 1), time.time()
    if stop == "SIGTERM":
        os.kill(stopped, signal.SIGTERM)
    else:
        os.kill(stopped, signal.SIGSTOP)
    if stop == "freeze":
        time.sleep(FREEZE)
        os.kill(stopped, signal.SIGCONT)
    rc, text = finish(run, log, timeout=100)
    assert rc == 0, text
    code = {"SIGTERM": 143, "freeze": 1, "frozen": 137}[stop]
    assert re.search(rf"singa-run: job \d+: process 1 failed \(exit {code}\); restart 1 of 1: "
                     rf"it rejoins the running job", text), text
    assert "from its newest complete snapshot" not in text and "no answer for" not in text, text
    assert "Process 1 rejoined the job" in text, text
    if stop == "freeze":
        assert re.search(r"this process \(1 of job \d+\) was taken for lost by the others", text), \
            text
    if stop == "frozen":
        assert re.search(rf"process 1 \(pid {stopped}\) is stopped \(frozen\) past its ZooKeeper "
                         rf"session; killing it, to restart it", text), text
    resumed = int(re.search(r"Process 1 rejoins job \d+ at step (\d+)", text)[1])
    with open(tmp_path / "ws" / "metrics.csv") as f:   # a frozen one goes on a while: not its
        rows = [row for row in csv.DictReader(f) if row["metric"] == "accuracy" and
                row["group"] == "1" and row["phase"] == "train" and
                float(row["wall_time"]) > at and int(row["step"]) >= resumed]
    assert [int(r["step"]) for r in rows] == [s for s in range(0, SHORT, 200) if s >= resumed], \
        rows
    assert (tmp_path / "ws" / "checkpoint" / f"step{SHORT}-worker0.bin").is_file()


def test_a_hogwild_worker_process_over_ssh_stopped_rejoins_and_past_max_restarts_stops_the_job(
        fixture_job, ssh_env, singa_conf, tmp_path):
    """Distributed Hogwild, servers in a process of their own, every process started over
    ssh: SIGINT to process 1 restarts it (over ssh again) and its group trains on with its
    server group (the bug: its workers' farewell stopped server group 1 at once, and the
    rejoined group trained nothing); a kill -9 of it then (max_restarts 1) stops the whole job
    with one line."""
    env, ssh_log = ssh_env
    (singa_conf.parent / "hostfile").write_text("127.0.0.1\n")
    conf = fixture_job(head="max_restarts: 1\n", edits={
        **EDITS, "cluster { nworker_groups: 1 nserver_groups: 1":
            "cluster { nworker_groups: 2 nserver_groups: 2 nservers_per_procs: 2 "
            "server_worker_separate: true sync_freq: 2", "train_steps: 200": "train_steps: 100000"})
    log = tmp_path / "run.log"
    run = launch(conf, env, log)
    wait_for(run, log, "Test @ step 200")
    job = int(re.search(r"Unique JOB_ID is (\d+)", log.read_text())[1])
    os.kill(job_process(run, 1, job), signal.SIGINT)
    wait_for(run, log, "Process 1 rejoined the job")
    back = time.time()
    resumed = int(re.search(r"Process 1 rejoins job \d+ at step (\d+)", log.read_text())[1])
    deadline = time.monotonic() + 60
    while not [r for r in metrics_rows(tmp_path / "ws", "1", "train")
               if float(r["wall_time"]) > back and int(r["step"]) >= resumed + 200]:
        assert time.monotonic() < deadline and run.poll() is None, log.read_text()
        time.sleep(0.2)
    os.kill(job_process(run, 1, job), signal.SIGKILL)
    rc, text = finish(run, log)
    assert rc == 137, text
    assert re.search(r"singa-run: job \d+: process 1 failed \(exit 130\); restart 1 of 1: it "
                     r"rejoins the running job", text), text
    assert re.search(r"singa-run: job \d+: process 1 failed \(exit 137\); not restarted: "
                     r"max_restarts 1 reached", text), text
    assert "restart 2 of" not in text
    launched = ssh_log.read_text()
    assert launched.count(" -procs_id 1 -host ") == 1, launched
    assert launched.count(" -procs_id 1 -rejoin -host ") == 1, launched


def metrics_rows(ws, group, phase):
    """The accuracy rows of worker group `group` ("1") and `phase` in `ws`'s metrics.csv."""
    with open(ws / "metrics.csv") as f:
        return [row for row in csv.DictReader(f) if row["metric"] == "accuracy" and
                row["group"] == group and row["phase"] == phase]
