"""singatool (`python -m singa.cluster.tool`) and the shell scripts, against a real ZooKeeper."""
import os
import socket
import subprocess
import sys
import time

import pytest

import processes
import singa
from conftest import zookeeper
from singa.cluster.cluster_rt import ZKClusterRuntime
from singa.cluster.job_manager import JobManager
from singa.cluster.zk import ZKService


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory):
    """This module's own ZooKeeper: its tests list every job, so no other module's may be there
    (jobs killed elsewhere stay, their nodes protected)."""
    yield from zookeeper(tmp_path_factory)


BIN = os.path.join(singa.HOME, "bin")


def tool(*args, confdir):
    return subprocess.run([sys.executable, "-m", "singa.cluster.tool", *args, "-confdir", str(confdir)],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def confdir(singa_conf, zk_server):
    with ZKService(zk_server) as zk:       # each test starts from an empty /singa
        JobManager(zk).cleanup()
    return singa_conf.parent


def script_env(confdir):
    return dict(os.environ, PYTHON=sys.executable, SINGA_CONF=str(confdir))


def start_registered_process(zk_server, job_id, tmp_path):
    """A process of job `job_id` (its arguments say so, as a driver's do) that registers and
    stays alive; returns it once registered."""
    ready = tmp_path / f"ready-{time.monotonic_ns()}"
    code = ("import os, sys, time; from singa.cluster.zk import ZKService; from singa.cluster.cluster_rt import ZKClusterRuntime; "
            f"z = ZKClusterRuntime(ZKService({zk_server!r}), {job_id}); z.register_proc('localhost:0', os.getpid()); "
            f"open({str(ready)!r}, 'w').close(); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, "-singa_job", str(job_id), "-conf", "x"])
    deadline = time.monotonic() + 15
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "helper process did not register"
        time.sleep(0.05)
    return proc


def test_getlogdir_strips_trailing_slash(confdir, tmp_path):
    r = tool("getlogdir", confdir=confdir)
    assert (r.returncode, r.stdout) == (0, f"{tmp_path / 'log'}\n")


def test_getzkhost_and_withzkhost(confdir, zk_server):
    assert tool("getzkhost", confdir=confdir).stdout == f"{zk_server}\n"
    r = tool("withzkhost", "10.0.0.5:2181", confdir=confdir)
    assert r.returncode == 0 and 'zookeeper_host: "10.0.0.5:2181"\n' in r.stdout
    assert "log_dir: " in r.stdout


def test_waitzk_answers_0_for_a_server_and_3_for_none(confdir, tmp_path, closed_port):
    assert tool("waitzk", "5", confdir=confdir).returncode == 0
    (tmp_path / "closed").mkdir()
    (tmp_path / "closed" / "singa.conf").write_text(f'zookeeper_host: "127.0.0.1:{closed_port}"\n')
    t = time.monotonic()
    r = tool("waitzk", "30", "-local", confdir=tmp_path / "closed")
    assert (r.returncode, r.stdout, r.stderr) == (3, "", "")
    assert time.monotonic() - t < 15        # -local: nothing listens, no wait


def test_what_the_scripts_ask_of_a_job_conf(fixture_job, tmp_path):
    job = fixture_job(head="max_restarts: 3\n", edits={"nworker_groups: 1": "nworker_groups: 2"})
    ask = lambda *args: tool(*args, confdir=tmp_path / "none").stdout      # noqa: E731
    assert (ask("nprocs", str(job)), ask("jobname", str(job))) == ("2\n", "fixture-mlp\n")
    assert ask("maxrestarts", str(job)) == ask("maxrestarts", str(job), "-test") == "3\n"
    assert len(ask("newsecret")) == 65 and int(ask("freeport", "127.0.0.1")) > 0


def test_create_prints_increasing_ids(confdir):
    ids = [int(tool("create", confdir=confdir).stdout) for _ in range(2)]
    assert ids == [0, 1]


def test_list_view_remove_removeall_cleanup(confdir, zk_server, tmp_path):
    with ZKService(zk_server) as zk:
        a, b = JobManager(zk).new_job_id(), JobManager(zk).new_job_id()
        ZKClusterRuntime(zk, a).register_proc("localhost:0", 4242)
        ZKClusterRuntime(zk, b).register_proc("node7:6723", 77)
        ZKClusterRuntime(zk, b).register_proc("node8:6723", 88)

        r = tool("list", confdir=confdir)
        assert r.returncode == 0
        assert r.stdout == ("JOB ID    |NUM PROCS  \n----------|-----------\n"
                            f"{a:<10d}|{1:<10d}\n{b:<10d}|{2:<10d}\n")
        r = tool("view", str(b), confdir=confdir)
        assert (r.returncode, r.stdout) == (0, "node7|77\nnode8|88\n")

        assert tool("remove", str(a), confdir=confdir).returncode == 0
        assert tool("list", confdir=confdir).stdout.splitlines()[2:] == [f"{b:<10d}|{2:<10d}"]
        assert tool("listall", confdir=confdir).stdout.splitlines()[2:] == [
            f"{a:<10d}|{0:<10d}", f"{b:<10d}|{2:<10d}"]

        assert tool("removeall", confdir=confdir).returncode == 0
        assert tool("listall", confdir=confdir).stdout.splitlines()[2:] == []
        assert int(tool("create", confdir=confdir).stdout) == b + 1

        assert tool("cleanup", confdir=confdir).returncode == 0
        assert not zk.client.exists("/singa")
    assert int(tool("create", confdir=confdir).stdout) == 0


def test_procstate_says_where_a_process_stands(confdir, zk_server):
    """What singa-run.sh asks of a remote process: running (host|pid), done,
    stopped (a signal's or a failure's mark), lost (neither), over (no process left)."""
    with ZKService(zk_server) as zk:
        job = JobManager(zk).new_job_id()
        runtimes = [ZKClusterRuntime(ZKService(zk_server), job) for _ in range(4)]
        for i, rt in enumerate(runtimes):
            rt.register_proc(f"node{i}:6723", 70 + i, rt.reserve_proc(i))
        states = lambda: [tool("procstate", str(job), str(i), confdir=confdir).stdout.strip()
                          for i in range(4)]
        assert states() == [f"running node{i}|{70 + i}" for i in range(4)]
        runtimes[1].proc_done(1)
        runtimes[2].proc_done(2, "SIGTERM")
        for rt in runtimes[1:]:
            rt.zk.close()               # their sessions end with their proc nodes
        assert states() == ["running node0|70", "done", "stopped", "lost"]
        runtimes[0].close()             # the last to leave deletes the marks
        runtimes[0].zk.close()
        assert states() == ["over"] * 4


def test_view_of_unknown_job_is_a_runtime_error(confdir, zk_server):
    r = tool("view", "12345", confdir=confdir)
    assert r.returncode == 2
    assert r.stderr == f"singatool: job 12345 does not exist in ZooKeeper at {zk_server}\n"


def test_genhost_uses_cluster_block_and_round_robins(confdir, tmp_path):
    (confdir / "hostfile").write_text("h0\nh1\nh2\n")
    job = tmp_path / "job.conf"
    # an extension field outside the cluster block (as in the rnnlm example) does not matter
    job.write_text('name: "x"\n[singa.lossconf] { nclass: 3 }\n'
                   "cluster {\n  nworker_groups: 2\n  nworkers_per_group: 2\n"
                   "  server_worker_separate: true\n}\n")
    r = tool("genhost", str(job), confdir=confdir)
    assert (r.returncode, r.stdout) == (0, "h0\nh1\nh2\nh0\nh1\n")     # 4 worker + 1 server procs
    assert tool("genhost", confdir=confdir).stdout == "h2\n"


def test_genhost_bad_cluster_field_names_file_and_line(confdir, tmp_path):
    job = tmp_path / "job.conf"
    job.write_text('name: "x"\ncluster {\n  nworker_groups: 1\n  nworkers: 2\n}\n')
    r = tool("genhost", str(job), confdir=confdir)
    assert r.returncode == 2
    assert r.stderr.startswith(f"singatool: {job}:4: ")
    assert r.stderr.count("\n") == 1


@pytest.mark.parametrize("text, line, what", [
    (b'name: "x\xff"\ncluster {\n  nworker_groups: 1\n}\n', 1, "not UTF-8 text"),
    (b'name: "x"\ncluster {\n  nworker_groups: 1\n  nworkers_per_procs: 0\n}\n', 4,
     "cluster.nworkers_per_procs must be at least 1, got 0")])
def test_genhost_bad_conf_is_one_line_naming_file_and_line(confdir, tmp_path, text, line, what):
    job = tmp_path / "job.conf"
    job.write_bytes(text)
    r = tool("genhost", str(job), confdir=confdir)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"singatool: {job}:{line}: {what}\n")


@pytest.mark.parametrize("args", [[], ["bogus"], ["view"], ["view", "abc"], ["list", "extra"],
                                  ["waitzk", "x"], ["waitzk", "3", "-test"],
                                  ["procstate", "1"], ["procstate", "1", "x"]])
def test_usage_errors_exit_1(confdir, args):
    r = tool(*args, confdir=confdir)
    assert r.returncode == 1
    assert "Usage: singatool <command>" in r.stderr


@pytest.mark.parametrize("args", [["view", "abc"], ["view", "²"], ["kill", "-1"]])
def test_console_bad_job_id_is_one_line(tmp_path, args):
    """`view` handed a bad id on to singatool, whose answer was its whole usage."""
    r = subprocess.run([os.path.join(BIN, "singa-console.sh"), *args], capture_output=True,
                       text=True, timeout=30, env=dict(script_env(tmp_path), SINGA_LOG="/tmp"))
    assert r.returncode == 1
    assert r.stderr == f"singa-console: job id must be a number, not '{args[1]}'\n"


def test_unreachable_zookeeper_exits_2_with_one_line(tmp_path, closed_port):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "singa.conf").write_text(f'zookeeper_host: "127.0.0.1:{closed_port}"\n')
    t = time.monotonic()
    r = tool("list", confdir=conf)
    assert time.monotonic() - t < 15
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.startswith(f"singatool: cannot reach ZooKeeper at 127.0.0.1:{closed_port} (")
    assert r.stderr.count("\n") == 1


def test_missing_singa_conf_exits_2(tmp_path):
    r = tool("create", confdir=tmp_path)
    assert r.returncode == 2
    assert r.stderr == f"singatool: {tmp_path / 'singa.conf'}: cannot read: No such file or directory\n"


def test_console_list_view_kill(confdir, zk_server, tmp_path):
    with ZKService(zk_server) as zk:
        job_id = JobManager(zk).new_job_id()
    proc = start_registered_process(zk_server, job_id, tmp_path)
    try:
        env = script_env(confdir)
        console = os.path.join(BIN, "singa-console.sh")
        r = subprocess.run([console, "list"], env=env, capture_output=True, text=True)
        assert r.stdout.splitlines()[2:] == [f"{job_id:<10d}|{1:<10d}"]
        r = subprocess.run([console, "view", str(job_id)], env=env, capture_output=True, text=True)
        assert r.stdout.splitlines()[0] == f"localhost|{proc.pid}"
        assert r.stdout.splitlines()[1].startswith(f"job {job_id}: no job information in ")
        # its launcher (bin/singa-run.sh, as its job information names it) killed: said so
        info = os.path.join(tool("getlogdir", confdir=confdir).stdout.strip(), "job-info",
                            f"job-{job_id}-20261128-120000")
        os.makedirs(info)
        gone = subprocess.Popen(["true"])
        gone.wait()
        with open(os.path.join(info, "launcher"), "w") as f:
            f.write(f"{socket.gethostname()} {gone.pid}\n")
        r = subprocess.run([console, "list"], env=env, capture_output=True, text=True)
        assert r.stdout.splitlines()[0] == "JOB ID    |NUM PROCS |UNSUPERVISED", r.stdout
        assert r.stdout.splitlines()[2] == f"{job_id:<10d}|{1:<10d}|yes", r.stdout
        r = subprocess.run([console, "kill", str(job_id)], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert proc.wait(10) == -15       # SIGTERM first
        with ZKService(zk_server) as zk:
            assert JobManager(zk).list_jobs(all=True) == [(job_id, 0)]
        r = subprocess.run([console, "bogus"], env=env, capture_output=True, text=True)
        assert r.returncode == 1 and "list" in r.stderr and "view" in r.stderr and "kill" in r.stderr
    finally:
        proc.kill()
        proc.wait()


def test_stop_and_cleanup_scripts(confdir, zk_server, tmp_path):
    with ZKService(zk_server) as zk:
        a, b = JobManager(zk).new_job_id(), JobManager(zk).new_job_id()
    procs = [start_registered_process(zk_server, a, tmp_path), start_registered_process(zk_server, b, tmp_path)]
    try:
        env = script_env(confdir)
        r = subprocess.run([os.path.join(BIN, "singa-stop.sh")], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert [p.wait(10) for p in procs] == [-15, -15]
        with ZKService(zk_server) as zk:
            assert JobManager(zk).list_jobs(all=True) == []
            assert JobManager(zk).new_job_id() == b + 1
        r = subprocess.run([os.path.join(BIN, "singa-cleanup.sh")], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        with ZKService(zk_server) as zk:
            assert JobManager(zk).new_job_id() == 0
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_zk_service_start_stop_are_idempotent(tmp_path, closed_port):
    env = dict(os.environ, ZK_PORT=str(closed_port), ZK_DATA=str(tmp_path / "zk"))
    service = os.path.join(BIN, "zk-service.sh")

    def run(cmd):
        return subprocess.run([service, cmd], env=env, capture_output=True, text=True, timeout=60)

    assert run("status").returncode == 3
    first = run("start")
    try:
        assert first.returncode == 0, first.stderr
        second = run("start")
        assert second.returncode == 0 and "already running" in second.stdout
        pid = int((tmp_path / "zk" / "zookeeper.pid").read_text())
        assert run("status").returncode == 0
        cfg = (tmp_path / "zk" / "zoo.cfg").read_text()
        assert f"clientPort={closed_port}\n" in cfg and "admin.enableServer=false\n" in cfg
        assert "4lw.commands.whitelist=*\n" in cfg
    finally:
        stopped = run("stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not processes.alive(pid)
    again = run("stop")
    assert again.returncode == 0 and "not running" in again.stdout
    assert run("status").returncode == 3
