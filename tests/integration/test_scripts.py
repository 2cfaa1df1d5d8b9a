"""bin/singa-run.sh, singa-console.sh and singa-stop.sh running real jobs on a real ZooKeeper."""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

import processes
import singa
from conftest import finish, free_port, job_process, launch, wait_for, zk_service, zookeeper
from singa.cluster.cluster_rt import ZKClusterRuntime
from singa.cluster.job_manager import JobManager
from singa.cluster.zk import ZKService


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory):
    """This module's own ZooKeeper: its tests list every job, so no other module's may be there
    (jobs killed elsewhere stay, their nodes protected)."""
    yield from zookeeper(tmp_path_factory)


BIN = os.path.join(singa.HOME, "bin")
TRAIN = re.compile(r"\] Train @ step \d+  Loss = \d+\.\d{6}, accuracy = \d+\.\d{6}$", re.M)
TEST = re.compile(r"\] Test @ step \d+\n.*\]    Loss = \d+\.\d{6}, accuracy = (\d+\.\d{6})$", re.M)
TRAIN_DATA = """\
  layer { name: "data" type: kRecordInput include: kTrain
    store_conf { backend: "kvfile" path: "tests/fixtures/singa-0.3/train-1000.bin" batchsize: 50 shape: 784 std_value: 255 } }
"""
LONG = {"train_steps: 200": "train_steps: 1000000", "test_freq: 100": "test_freq: 0",
        "checkpoint_freq: 100": "checkpoint_freq: 0", "disp_freq: 20": "disp_freq: 1000"}


def script(name, *args, env, timeout=180):
    return subprocess.run([os.path.join(BIN, name), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def job_id(stdout):
    return int(re.search(r"^Unique JOB_ID is (\d+)$", stdout, re.M)[1])


def listed(env):
    """{job id: number of procs} of `singa-console.sh list`."""
    r = script("singa-console.sh", "list", env=env)
    assert r.returncode == 0, r.stderr
    return {int(a): int(b) for a, b in (line.split("|") for line in r.stdout.splitlines()[2:])}


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


class LongJob:
    """`singa-run.sh -conf <a job of a million steps>` in its own process group, output to files."""

    def __init__(self, conf, env, tmp_path):
        self.out = tmp_path / f"run-{time.monotonic_ns()}.out"
        with open(self.out, "w") as out:
            self.proc = subprocess.Popen([os.path.join(BIN, "singa-run.sh"), "-conf", str(conf)],
                                         env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.env = env

    def wait_listed(self, timeout=60):
        """The job id once `singa-console.sh list` shows the job with its process."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.out.read_text()
            m = re.search(r"^Unique JOB_ID is (\d+)$", self.out.read_text(), re.M)
            if m and listed(self.env).get(int(m[1])) == 1:
                return int(m[1])
            time.sleep(0.2)
        pytest.fail(f"the job was not listed within {timeout} s:\n{self.out.read_text()}")

    def pid(self, job_id):
        """(host, pid) of the job's one process, from `singa-console.sh view`."""
        proc = script("singa-console.sh", "view", str(job_id), env=self.env).stdout.splitlines()[0]
        host, pid = proc.split("|")
        return host, int(pid)

    def wait(self, timeout=60):
        """singa-run.sh's exit status; a script still running `timeout` s later fails the test."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"singa-run.sh still runs {timeout} s later:\n{self.out.read_text()}")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def long_job(fixture_job, env, tmp_path):
    """start(name="long", env=env): a LongJob with its own workspace <tmp>/<name>; processes
    still running at the end of the test are killed."""
    jobs = []

    def start(name="long", env=env):
        conf = fixture_job(f"{name}.conf", workspace=tmp_path / name, edits=LONG)
        jobs.append(LongJob(conf, env, tmp_path))
        return jobs[-1]
    yield start
    for job in jobs:
        job.stop()
    for pid in started_pids(jobs):
        if cmdline(pid):
            os.kill(pid, signal.SIGKILL)


def started_pids(jobs):
    """Pids of `singa` processes the jobs' output shows (an orphaned driver too)."""
    pids = []
    for job in jobs:
        pids += [int(p) for p in re.findall(r"\(pid = (\d+)\)", job.out.read_text())]
    return pids


def test_run_trains_with_job_info_and_test_reads_its_checkpoint(fixture_job, env, tmp_path):
    conf = fixture_job()
    r = script("singa-run.sh", "-conf", str(conf), env=env)
    assert r.returncode == 0, r.stderr
    n = job_id(r.stdout)
    info = re.search(r"^Record job information to (.+)$", r.stdout, re.M)[1]
    assert info.startswith(f"{tmp_path / 'log'}/job-info/job-{n}-")
    assert open(os.path.join(info, "job.conf")).read() == conf.read_text()
    assert open(os.path.join(info, "job.hosts")).read() == "localhost\n"
    executing = re.search(r"^Executing : (.+)$", r.stdout, re.M)[1]
    assert "-m singa.driver" in executing and \
        executing.endswith(f"-singa_job {n} -conf {conf} -procs_id 0")
    assert len(TRAIN.findall(r.stderr)) == 10

    # a conf made for testing alone, as SINGA's Driver::Test allows: no kTrain data layer
    snap = tmp_path / "ws" / "checkpoint" / "step200-worker0.bin"
    test_conf = fixture_job("test.conf", head=f'checkpoint_path: "{snap}"\n',
                            edits={TRAIN_DATA: ""})
    r = script("singa-run.sh", "-conf", str(test_conf), "-test", env=env)
    assert r.returncode == 0, r.stderr
    assert job_id(r.stdout) > n
    accuracy, = TEST.findall(r.stderr)
    assert float(accuracy) >= 0.6
    assert not TRAIN.search(r.stderr)


def test_job_ids_increase_between_runs(fixture_job, env):
    conf = fixture_job(edits={"train_steps: 200": "train_steps: 1"})
    ids = []
    for _ in range(2):
        r = script("singa-run.sh", "-conf", str(conf), env=env)
        assert r.returncode == 0, r.stderr
        ids.append(job_id(r.stdout))
    assert ids[1] > ids[0]


def test_console_lists_views_and_kills_a_running_job(long_job, env):
    job = long_job()
    n = job.wait_listed()
    host, pid = job.pid(n)
    assert host == "localhost"
    assert "singa.driver" in cmdline(pid) and f"-singa_job {n} " in cmdline(pid)
    deadline = time.monotonic() + 60     # view also shows the latest display of the job
    while "Train @ step" not in (view := script("singa-console.sh", "view", str(n), env=env)).stdout:
        assert time.monotonic() < deadline, view.stdout + view.stderr
        time.sleep(0.2)
    assert re.search(r"^Train @ step \d+ of 1000000  loss = \d+\.\d{6}, accuracy = \d+\.\d{6}$",
                     view.stdout, re.M), view.stdout

    r = script("singa-console.sh", "kill", str(n), env=env)
    assert r.returncode == 0, r.stderr
    # SIGTERM first: the driver stops; singa-run.sh passes on its status
    assert job.wait() == 128 + signal.SIGTERM
    assert cmdline(pid) == ""
    assert n not in listed(env)


def test_stop_ends_every_job(long_job, env, zk_server):
    jobs = [long_job("a"), long_job("b")]
    pids = [job.pid(job.wait_listed())[1] for job in jobs]
    r = script("singa-stop.sh", env=env)
    assert r.returncode == 0, r.stderr
    assert [job.wait() for job in jobs] == [128 + signal.SIGTERM] * 2
    assert [cmdline(pid) for pid in pids] == ["", ""]
    with ZKService(zk_server) as zk:
        assert JobManager(zk).list_jobs(all=True) == []


def test_a_job_that_fails_at_once_ends_the_launch_with_its_own_line_alone(nan_csv_job, env):
    """The job's processes end within the launcher's first look; the watcher it starts then
    and stops at once ran the launcher's exit trap in its fork, and bash said 'wait_for: No
    record of process' in the launcher's name."""
    r = script("singa-run.sh", "-conf", str(nan_csv_job), env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.endswith("singa: step 6: the loss of layer '0#loss' is nan; the first "
                             "non-finite values are in the output of layer '0#data'\n")
    assert "singa-run.sh:" not in r.stderr


def test_run_with_missing_conf_exits_2(env, tmp_path):
    conf = tmp_path / "none.conf"
    r = script("singa-run.sh", "-conf", str(conf), env=env)
    assert r.returncode == 2
    assert r.stderr == f"singa-run: {conf} not exists\n"
    assert r.stdout == ""


def test_run_starts_a_process_per_host_of_a_multi_process_job(fixture_job, env, tmp_path):
    """Sandblaster: 2 worker processes and a server process, all on `localhost` (SINGA 0.3
    cannot: ZeroMQ refuses tcp://localhost:*)."""
    conf = fixture_job(edits={"cluster { nworker_groups: 1 nserver_groups: 1":
                              "cluster { nworker_groups: 1 nserver_groups: 1 nworkers_per_group: 2 "
                              "server_worker_separate: true"})
    r = script("singa-run.sh", "-conf", str(conf), env=env)
    assert r.returncode == 0, r.stderr
    info = re.search(r"^Record job information to (.+)$", r.stdout, re.M)[1]
    assert open(os.path.join(info, "job.hosts")).read() == "localhost\n" * 3
    assert r.stdout.count("Executing : ") == 3
    assert len(re.findall(r"proc #\d -> 127\.0\.0\.1:\d+ \(pid = \d+\)", r.stderr)) == 3
    assert len(TRAIN.findall(r.stderr)) == 10
    for w in (0, 1):
        assert (tmp_path / "ws" / "checkpoint" / f"step200-worker{w}.bin").is_file()


def test_max_restarts_restarts_a_job_whose_server_process_was_killed(fixture_job, env,
                                                                    tmp_path):
    """SINGA's Downpour layout, process 0 (the servers and group 0) killed: a process holding
    servers is not restarted alone (as an asynchronous job's worker-only process is,
    test_elastic): the whole job restarts from its newest snapshot and finishes."""
    conf = fixture_job(head="max_restarts: 1\n", edits={
        "cluster { nworker_groups: 1": "cluster { nworker_groups: 2",
        "train_steps: 200": "train_steps: 1000", "checkpoint_freq: 100": "checkpoint_freq: 50"})
    log = tmp_path / "run.log"
    run = launch(conf, env, log)
    wait_for(run, log, "step50-worker0.bin")
    os.kill(job_process(run, 0), signal.SIGKILL)
    rc, text = finish(run, log)
    assert rc == 0, text
    assert re.search(r"singa-run: job \d+ failed \(exit \d+\); restart 1 of 1 from its newest "
                     r"complete snapshot", text)
    assert re.search(r"Resume from step [1-9]\d*", text) and "was lost" in text
    assert "rejoin" not in text
    assert (tmp_path / "ws" / "checkpoint" / "step1000-worker0.bin").is_file()


def test_a_frozen_process_is_taken_for_lost_and_the_launcher_ends(fixture_job, env, tmp_path):
    """SIGSTOP to one process: the other takes it for lost and stops; the launcher, which
    would wait for the stopped process for ever, kills it once it has left ZooKeeper."""
    conf = fixture_job(edits={
        "cluster { nworker_groups: 1 nserver_groups: 1":
            "cluster { nworker_groups: 1 nserver_groups: 1 nworkers_per_group: 2 "
            "nservers_per_group: 2", **LONG})
    log = tmp_path / "run.log"
    run = launch(conf, env, log)
    wait_for(run, log, "Train @ step 1000 ")
    frozen = job_process(run, 1)
    os.kill(frozen, signal.SIGSTOP)
    rc, text = finish(run, log, timeout=120)
    assert rc != 0, text
    assert re.search(rf"process 1 of job \d+ \(127\.0\.0\.1:\d+, pid {frozen}\) was lost",
                     text), text
    assert f"singa-run: process {frozen} left job {job_id(text)} in ZooKeeper but is stopped " \
        f"(frozen); killing it" in text, text


def test_sigterm_to_one_process_stops_the_job_at_once_and_restarts_it(fixture_job, env,
                                                                     tmp_path):
    """An admin's kill of one process is a failure, not a user's stop: the other process stops
    within 15 s naming it, and max_restarts restarts the job, which finishes."""
    conf = fixture_job(head="max_restarts: 1\n", edits={
        "cluster { nworker_groups: 1 nserver_groups: 1":
            "cluster { nworker_groups: 1 nserver_groups: 1 nworkers_per_group: 2 "
            "nservers_per_group: 2",
        "train_steps: 200": "train_steps: 1000", "checkpoint_freq: 100": "checkpoint_freq: 50"})
    log = tmp_path / "run.log"
    run = launch(conf, env, log)
    wait_for(run, log, "step50-worker1.bin")
    stopped = job_process(run, 0)
    os.kill(stopped, signal.SIGTERM)
    signalled = time.monotonic()
    wait_for(run, log, "restart 1 of 1", 60)
    stopped_in = time.monotonic() - signalled
    rc, text = finish(run, log)
    print(f"SIGTERM to one process: the job stopped {stopped_in:.1f} s later")
    assert rc == 0 and stopped_in <= 15, (stopped_in, text)
    assert re.search(rf"process 0 of job \d+ \(127\.0\.0\.1:\d+, pid {stopped}\) was "
                     rf"stopped by SIGTERM", text), text
    assert (tmp_path / "ws" / "checkpoint" / "step1000-worker1.bin").is_file()


@pytest.mark.parametrize("how", ["SIGTERM to singa-run.sh", "Ctrl-C", "SIGHUP to singa-run.sh"])
def test_signal_to_run_stops_every_process_of_the_job(how, long_job, env):
    job = long_job()
    n = job.wait_listed()
    _, pid = job.pid(n)
    if how == "Ctrl-C":     # the terminal signals the whole foreground process group
        os.killpg(job.proc.pid, signal.SIGINT)
        expected = 128 + signal.SIGINT
    elif how == "SIGHUP to singa-run.sh":      # a terminal hangup
        job.proc.send_signal(signal.SIGHUP)
        expected = 128 + signal.SIGHUP
    else:
        job.proc.send_signal(signal.SIGTERM)
        expected = 128 + signal.SIGTERM
    assert job.wait() == expected, job.out.read_text()
    assert cmdline(pid) == ""
    assert n not in listed(env)


def test_sigterm_to_run_stops_a_process_it_started_over_ssh(long_job, ssh_env, singa_conf):
    env, ssh_log = ssh_env
    (singa_conf.parent / "hostfile").write_text("node1\n")
    job = long_job(env=env)
    n = job.wait_listed()
    host, pid = job.pid(n)
    assert host == "node1"
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait() == 128 + signal.SIGTERM, job.out.read_text()
    assert cmdline(pid) == ""
    assert n not in listed(env)
    assert f"-- node1 bash -s -- {n} {pid} " in ssh_log.read_text()   # stopped over ssh


WAYS_OUT = ["the job's end", "a host it cannot reach", "a failed process, restarted once",
            "SIGTERM", "Ctrl-C"]


@pytest.mark.parametrize("way", WAYS_OUT)
def test_every_way_out_of_run_leaves_nothing_of_the_launch_running(way, fixture_job, ssh_env,
                                                                   singa_conf, tmp_path):
    """Whichever way singa-run.sh ends, nothing it started runs on once it has returned: no
    process whose command line or environment names the launch's conf folder (its watcher,
    `singatool wait`, started for a process over ssh, lived on when its subshell was killed;
    one whose job never registered waited forever)."""
    env, _ = ssh_env
    (singa_conf.parent / "hostfile").write_text("down1\n" if "reach" in way else "node1\n")
    edits = {"train_steps: 200": "train_steps: 20"} if way == "the job's end" else LONG
    conf = fixture_job(edits=edits, head="max_restarts: 1\n" if "restarted" in way else "")
    out = tmp_path / "run.out"
    with open(out, "w") as f:
        run = subprocess.Popen([os.path.join(BIN, "singa-run.sh"), "-conf", str(conf)], env=env,
                               stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for_process(n):
        """The pid of the job's n-th process started (counting restarts)."""
        deadline = time.monotonic() + 60
        while len(pids := re.findall(r"\(pid = (\d+)\)", out.read_text())) < n:
            assert time.monotonic() < deadline and run.poll() is None, out.read_text()
            time.sleep(0.1)
        return int(pids[n - 1])
    try:
        if "restarted" in way:
            for n in (1, 2):
                os.kill(wait_for_process(n), signal.SIGKILL)
        elif way in ("SIGTERM", "Ctrl-C"):
            wait_for_process(1)
            if way == "SIGTERM":
                run.send_signal(signal.SIGTERM)
            else:
                os.killpg(run.pid, signal.SIGINT)
        rc = run.wait(timeout=90)
        left = processes.mentioning(str(singa_conf.parent))
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        processes.stop([pid for pid, _ in processes.mentioning(str(singa_conf.parent))], 0)
    text = out.read_text()
    assert rc == {"the job's end": 0, "a host it cannot reach": 1, "SIGTERM": 143,
                  "Ctrl-C": 130}.get(way, 128 + signal.SIGKILL), text
    if "reach" in way:
        assert "singa-run: lost host down1" in text, text
    if "restarted" in way:
        assert "restart 1 of 1" in text and "max_restarts 1 reached" in text, text
    assert left == [], (left, text)


def test_run_waits_for_a_zookeeper_that_starts_after_it_looked(fixture_job, env, singa_conf,
                                                               tmp_path):
    """singa.conf names another host's ZooKeeper (127.0.0.2 here), which starts only once
    singa-run.sh has looked for it: the launcher says what it waits for and how long, and the
    job runs once ZooKeeper serves (it gave up after 3 s, and a loaded machine takes longer
    than that to start one)."""
    port = free_port()
    hosts = f"127.0.0.2:{port}"
    singa_conf.write_text(f'zookeeper_host: "{hosts}"\nlog_dir: "{tmp_path / "log"}/"\n')
    zk_env = dict(os.environ, ZK_PORT=str(port), ZK_ADDRESS="127.0.0.2",
                  ZK_DATA=str(tmp_path / "zk"), SINGA_MANAGES_ZK="true")
    conf = fixture_job(edits={"train_steps: 200": "train_steps: 1"})
    out = tmp_path / "run.out"
    with open(out, "w") as f:
        run = subprocess.Popen([os.path.join(BIN, "singa-run.sh"), "-conf", str(conf)], env=env,
                               stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while f"waiting up to 30 s for ZooKeeper at {hosts}" not in out.read_text():
            assert time.monotonic() < deadline and run.poll() is None, out.read_text()
            time.sleep(0.1)
        zk_service("start", zk_env)
        rc = run.wait(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        zk_service("stop", zk_env, check=False)
    text = out.read_text()
    assert rc == 0, text
    assert text.count("singa-run: waiting up to 30 s for ZooKeeper") == 1, text
    assert re.search(rf"singa-run: waiting up to 30 s for ZooKeeper at {hosts} to open a "
                     rf"session \({hosts} Connection refused\)$", text, re.M), text


def test_run_checks_the_whole_conf_before_starting_anything(fixture_job, env, tmp_path):
    bad = fixture_job("bad.conf", edits={'srclayers: "sig1"': 'srclayers: "sig2"'})
    r = script("singa-run.sh", "-conf", str(bad), env=env)
    assert r.returncode == 2
    assert "Unique JOB_ID" not in r.stdout        # no job id taken, no process started
    assert str(bad) in r.stderr and "sig2" in r.stderr

    many = len(os.sched_getaffinity(0)) * 4 + 1
    crowd = fixture_job("crowd.conf", edits={
        "train_steps: 200": "train_steps: 1",
        "nworker_groups: 1": f"nworker_groups: 1 nworkers_per_group: {many}"})
    r = script("singa-run.sh", "-conf", str(crowd), env=env, timeout=60)
    assert r.returncode == 2
    assert "Unique JOB_ID" not in r.stdout
    line, = r.stderr.splitlines()
    assert f"{many} processes" in line and "localhost" in line and "-oversubscribe" in line


def start_sleeper(*args):
    """A process of its own session (pid = its group id) running python: sleep with `args`
    on its command line; it ignores SIGTERM when 'ignore-term' is among them."""
    code = ("import signal, sys, time\n"
            "if 'ignore-term' in sys.argv: signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            start_new_session=True, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_console_kill_signals_only_this_jobs_processes(ssh_env, zk_server):
    env, ssh_log = ssh_env
    with ZKService(zk_server) as zk:
        n = JobManager(zk).new_job_id()
        other = start_sleeper("-singa_job", str(n + 1), "-conf", "x")   # another job's process
        group = start_sleeper()                                         # a process group
        hostile = start_sleeper("-singa_job", str(n), "-conf", "x")
        stubborn = start_sleeper("-singa_job", str(n), "-conf", "x", "ignore-term")
        remote = start_sleeper("-singa_job", str(n), "-conf", "x")
        procs = [other, group, hostile, stubborn, remote]
        try:
            for endpoint, pid in [("localhost:0", other.pid), ("localhost:0", -group.pid),
                                  ("-oProxyCommand=x:0", hostile.pid),
                                  ("localhost:0", stubborn.pid), ("node1:0", remote.pid)]:
                ZKClusterRuntime(zk, n).register_proc(endpoint, pid)
            r = script("singa-console.sh", "kill", str(n), env=dict(env, SINGA_KILL_GRACE="1"))
            assert stubborn.wait(30) == -signal.SIGKILL      # SIGTERM ignored: SIGKILL after 1 s
            assert remote.wait(30) == -signal.SIGTERM        # over ssh
            assert [p.poll() for p in (other, group, hostile)] == [None] * 3
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
    assert r.returncode == 1
    assert f"pid {other.pid}" in r.stderr and "not a process of job" in r.stderr
    assert f"-{group.pid}" in r.stderr and "-oProxyCommand=x" in r.stderr
    assert "ProxyCommand" not in ssh_log.read_text()
    assert f"-- node1 bash -s -- {n} {remote.pid} 1" in ssh_log.read_text()


def test_paths_with_spaces(fixture_job, env, tmp_path, singa_conf):
    home = tmp_path / "my singa"
    home.symlink_to(singa.HOME)
    confdir = tmp_path / "conf dir"
    shutil.copytree(singa_conf.parent, confdir)
    env = dict(env, SINGA_CONF=str(confdir))
    conf = fixture_job("job conf.conf", workspace=tmp_path / "work space",
                       edits={"train_steps: 200": "train_steps: 20"})
    run = subprocess.run([str(home / "bin" / "singa-run.sh"), "-conf", str(conf)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "work space" / "checkpoint" / "step20-worker0.bin").is_file()
    r = subprocess.run([str(home / "bin" / "singa-console.sh"), "list"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("JOB ID"), r.stderr


FAKE_SBATCH = """#!/usr/bin/env bash
# sbatch stand-in: logs its arguments, runs the batch script (the last one) here at once, as
# Slurm would in an allocation of one node with --ntasks tasks, then says it submitted it
printf '%s\\n' "$*" >> {log}
for a; do case $a in --ntasks=*) ntasks=${{a#--ntasks=}} ;; esac; done
SLURM_JOB_ID=4242 SLURM_NTASKS=$ntasks SLURM_JOB_NUM_NODES=1 "${{@: -1}}"
echo "Submitted batch job 4242"
"""
FAKE_SRUN = """#!/usr/bin/env bash
# srun stand-in: the step's one task, here
while [[ $1 == --* ]]; do shift; done
exec "$@"
"""


def test_sbatch_needs_no_hostfile(fixture_job, env, singa_conf, tmp_path):
    """Slurm places the processes: singa-sbatch.sh, its batch script and singa-run.sh inside
    the allocation run a job from a conf folder without a hostfile (fake sbatch and srun: the
    batch script runs here, its step is the one process)."""
    (singa_conf.parent / "hostfile").unlink()
    bindir = tmp_path / "fake bin"
    bindir.mkdir()
    log = tmp_path / "sbatch.log"
    for name, text in (("sbatch", FAKE_SBATCH.format(log=shlex.quote(str(log)))),
                       ("srun", FAKE_SRUN)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    conf = fixture_job(edits={"train_steps: 200": "train_steps: 20"})
    r = script("singa-sbatch.sh", "-conf", str(conf), env=dict(env, PATH=f"{bindir}:{env['PATH']}"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.endswith("Submitted batch job 4242\n")
    assert "--ntasks=1 --job-name=singa-fixture-mlp " in log.read_text()
    assert re.search(r"^Executing : srun --ntasks=1 .* -host auto$", r.stdout, re.M), r.stdout
    assert len(TRAIN.findall(r.stderr)) == 1, r.stderr
    info = re.search(r"^Record job information to (.+)$", r.stdout, re.M)[1]
    assert open(os.path.join(info, "slurm.job")).read() == "4242\n"
