"""The job manager against a real ZooKeeper: strangers' nodes under /singa/app, shared nodes
deleted during a launch, and the launcher's wait riding through a ZooKeeper outage."""
import os
import subprocess
import sys
import threading
import time

import pytest

import singa
from conftest import free_port, zk_service, zookeeper
from singa.cluster.job_manager import JobManager
from singa.cluster.zk import APP, HOST_IDX, JOB_LOCK, ZKService, job_path
from singa.errors import ClusterError


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory):
    """This module's own ZooKeeper: its tests list every job, so no other module's may be there
    (jobs killed elsewhere stay, their nodes protected)."""
    yield from zookeeper(tmp_path_factory)


BIN = os.path.join(singa.HOME, "bin")


@pytest.fixture
def confdir(singa_conf, zk_server):
    with ZKService(zk_server) as zk:       # each test starts from an empty /singa
        JobManager(zk).cleanup()
    return singa_conf.parent


def run(*cmd, confdir):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHON=sys.executable, SINGA_CONF=str(confdir)))


def test_foreign_nodes_under_app_are_passed_over_by_list_console_and_stop(confdir, zk_server):
    with ZKService(zk_server) as zk:
        job_id = JobManager(zk).new_job_id()
        zk.ensure(job_path(job_id) + "/proc")
        for name in ("intruder", "job-", "job-12", "job-abcdefghij", "job-00000000001x"):
            zk.ensure(f"{APP}/{name}")
    for args in (("list",), ("listall",)):
        r = run(sys.executable, "-m", "singa.cluster.tool", *args, "-confdir", str(confdir),
                confdir=confdir)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"{job_id:<10d}|0" in r.stdout and "intruder" not in r.stdout, r.stdout
    r = run(os.path.join(BIN, "singa-console.sh"), "list", confdir=confdir)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    r = run(os.path.join(BIN, "singa-stop.sh"), confdir=confdir)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("node", [JOB_LOCK, HOST_IDX])
def test_a_shared_node_deleted_during_a_launch_is_one_line(node, confdir, zk_server, tmp_path):
    """`singatool create`/`genhost` after ensuring /singa/sys, a stranger (or a cleanup)
    deletes the node: a ClusterError naming it, not a NoNodeError traceback."""
    with ZKService(zk_server) as zk:
        zk.client.delete(node)
        jobs = JobManager(zk)
        with pytest.raises(ClusterError, match=f"{node} in ZooKeeper at {zk_server} was deleted"):
            if node == JOB_LOCK:
                jobs.new_job_id()
            else:
                jobs.gen_hosts(str(confdir / "hostfile"), 1)


def test_wait_ended_rides_through_a_zookeeper_outage(tmp_path):
    """The launcher's watcher (singatool wait): ZooKeeper stops and comes back while a process
    of the job is registered; the wait goes on, and returns once that process leaves."""
    env = dict(os.environ, ZK_PORT=str(free_port()), ZK_DATA=str(tmp_path / "zk"),
               SINGA_MANAGES_ZK="true")
    hosts = f"127.0.0.1:{env['ZK_PORT']}"
    service = lambda cmd: zk_service(cmd, env)  # noqa: E731
    service("start")
    try:
        with ZKService(hosts) as proc_zk, ZKService(hosts) as watch_zk:
            job = job_path(JobManager(proc_zk).new_job_id())
            proc_zk.ensure(job + "/proc")
            proc_zk.client.create(job + "/proc/proc-0", b"localhost:1|1", ephemeral=True)
            result = {}

            def wait():
                try:
                    JobManager(watch_zk).wait_ended(int(job[-10:]), poll=0.2)
                    result["ended"] = time.monotonic()
                except BaseException as e:      # the bug: ClusterError on connection loss
                    result["error"] = e
            waiter = threading.Thread(target=wait, daemon=True)
            waiter.start()
            time.sleep(1)
            service("stop")
            time.sleep(4)
            service("start")
            assert "error" not in result and "ended" not in result, result
            deadline = time.monotonic() + 30
            while not proc_zk.connected:
                assert time.monotonic() < deadline, "the process's session did not come back"
                time.sleep(0.2)
            time.sleep(2)
            assert waiter.is_alive(), result
            proc_zk.client.delete(job + "/proc/proc-0")
            left = time.monotonic()
            waiter.join(30)
            assert "error" not in result, result
            assert result["ended"] - left < 10, result
    finally:
        zk_service("stop", env, check=False)
