"""singa.zk, cluster_rt.ZKClusterRuntime and job_manager against a real ZooKeeper: SINGA's znode layout, ids, membership, listing."""
import os
import socket
import threading
import time

import pytest
from kazoo.client import KazooClient

from conftest import zk_service, zookeeper
from singa.errors import ClusterError, ConfigError
from singa.cluster_rt import ZKClusterRuntime
from singa.job_manager import JobManager
from singa.trust import JobTrust, new_secret
from singa.zk import ZKService, job_path, zookeeper_answers


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory):
    """This module's own ZooKeeper: its tests list every job, so no other module's may be there
    (jobs killed elsewhere stay, their nodes protected)."""
    yield from zookeeper(tmp_path_factory)


@pytest.fixture
def zk(zk_server):
    z = ZKService(zk_server)
    JobManager(z).cleanup()             # each test starts from an empty /singa
    z.close()
    z = ZKService(zk_server)
    yield z
    z.close()


@pytest.fixture
def raw(zk_server):
    """A plain kazoo client to look at the znodes."""
    c = KazooClient(zk_server)
    c.start(timeout=10)
    yield c
    c.stop()
    c.close()


def test_persistent_layout_after_connect(zk, raw):
    for path in ("/singa", "/singa/sys", "/singa/sys/job-lock", "/singa/app"):
        assert raw.exists(path) is not None, path
    assert raw.get("/singa/sys/host-idx")[0] == b"0"


def test_job_ids_increase_and_restart_after_cleanup(zk, zk_server):
    ids = [JobManager(zk).new_job_id() for _ in range(3)]
    assert ids == [ids[0], ids[0] + 1, ids[0] + 2]
    with ZKService(zk_server) as other:        # another session (another singatool) continues the sequence
        assert JobManager(other).new_job_id() == ids[2] + 1
    JobManager(zk).cleanup()
    with ZKService(zk_server) as fresh:
        assert JobManager(fresh).new_job_id() == 0


def test_a_job_a_cleanup_left_keeps_its_id_from_new_jobs(zk, zk_server):
    """A killed job's nodes are protected (its secret's ACL): cleanup leaves them, the id
    sequence restarts, and a new job passes over the id still taken, with or without a
    secret of its own."""
    JobManager(zk).cleanup()
    trust = JobTrust(new_secret())
    with ZKService(zk_server, trust=trust) as owner:
        left = JobManager(owner).new_job_id(trust)
        owner.ensure(f"{job_path(left)}/proc", acl=trust.zk_acl)      # as a killed job leaves it
    JobManager(zk).cleanup()
    with ZKService(zk_server) as fresh:
        assert fresh.client.exists(job_path(left))
        assert JobManager(fresh).new_job_id() == left + 1
    JobManager(zk).cleanup()
    other = JobTrust(new_secret())
    with ZKService(zk_server, trust=other) as fresh:
        assert JobManager(fresh).new_job_id(other) == left + 1
    with ZKService(zk_server, trust=trust) as owner:      # only its owner can delete it
        assert owner.delete_tree(job_path(left)) == []
    JobManager(zk).cleanup()


def test_job_lock_nodes_are_ephemeral_sequential(zk, raw):
    job_id = JobManager(zk).new_job_id()
    children = raw.get_children("/singa/sys/job-lock")
    assert children == [f"lock-{job_id:010d}"]
    _, stat = raw.get(f"/singa/sys/job-lock/lock-{job_id:010d}")
    assert stat.ephemeralOwner == zk.client.client_id[0]


def test_registration_gives_procs_ids_in_order_with_singa_values(zk, zk_server, raw):
    job_id = JobManager(zk).new_job_id()
    assert job_path(job_id) == f"/singa/app/job-{job_id:010d}"
    others = [ZKService(zk_server) for _ in range(2)]
    try:
        ids = [ZKClusterRuntime(zk, job_id).register_proc("localhost:0", 111)]
        ids += [ZKClusterRuntime(o, job_id).register_proc(f"host{i}:6723", 222 + i) for i, o in enumerate(others)]
        assert ids == [0, 1, 2]
        job = f"/singa/app/job-{job_id:010d}"
        assert sorted(raw.get_children(job)) == ["group", "proc", "proc-done", "proc-lock"]
        assert sorted(raw.get_children(job + "/proc")) == ["proc-0", "proc-1", "proc-2"]
        assert raw.get(job + "/proc/proc-0")[0] == b"localhost:0|111"
        assert raw.get(job + "/proc/proc-2")[0] == b"host1:6723|223"
        assert raw.get(job + "/proc/proc-1")[1].ephemeralOwner == others[0].client.client_id[0]
        assert len(raw.get_children(job + "/proc-lock")) == 3
        assert ZKClusterRuntime(zk, job_id).proc_endpoint(1) == "host0:6723"
        assert JobManager(zk).job_procs(job_id) == ["localhost|111", "host0|222", "host1|223"]
        assert JobManager(zk).list_jobs() == [(job_id, 3)]
    finally:
        others[0].close()
    # a process that ends (session closed) disappears from the job
    assert JobManager(zk).job_procs(job_id) == ["localhost|111", "host1|223"]
    others[1].close()


def test_proc_endpoint_waits_for_registration(zk, zk_server):
    job_id = JobManager(zk).new_job_id()
    with ZKService(zk_server) as other:
        ZKClusterRuntime(other, job_id).register_proc("first:1", 1)
        threading.Timer(0.3, ZKClusterRuntime(other, job_id).register_proc, ("second:2", 2)).start()
        assert ZKClusterRuntime(zk, job_id).proc_endpoint(1, timeout=5) == "second:2"
        t = time.monotonic()
        with pytest.raises(ClusterError, match=r"process 7 of job \d+ did not register .* within 0.5 s"):
            ZKClusterRuntime(zk, job_id).proc_endpoint(7, timeout=0.5)
        assert time.monotonic() - t < 2


def test_membership_watch_fires_when_last_worker_leaves(zk, zk_server, raw):
    job_id = JobManager(zk).new_job_id()
    emptied = threading.Event()
    ZKClusterRuntime(zk, job_id).watch_sgroup(0, emptied.set)
    group = f"/singa/app/job-{job_id:010d}/group/sg0"
    assert raw.exists(group) is not None
    ZKClusterRuntime(zk, job_id).join_sgroup(0, 0, 0)
    ZKClusterRuntime(zk, job_id).join_sgroup(1, 0, 0)
    assert sorted(raw.get_children(group)) == ["g0_w0", "g1_w0"]
    assert raw.get(group + "/g1_w0")[1].ephemeralOwner != 0
    ZKClusterRuntime(zk, job_id).leave_sgroup(0, 0, 0)
    assert not emptied.wait(0.5)
    ZKClusterRuntime(zk, job_id).leave_sgroup(1, 0, 0)
    assert emptied.wait(5)


def test_membership_watch_fires_when_worker_process_dies(zk, zk_server):
    job_id = JobManager(zk).new_job_id()
    emptied = threading.Event()
    ZKClusterRuntime(zk, job_id).watch_sgroup(2, emptied.set)
    worker = ZKService(zk_server)
    ZKClusterRuntime(worker, job_id).join_sgroup(0, 0, 2)
    assert not emptied.wait(0.3)
    worker.close()                      # its ephemeral node goes with the session
    assert emptied.wait(5)


def test_watch_does_not_fire_on_a_group_nobody_joined(zk):
    job_id = JobManager(zk).new_job_id()
    emptied = threading.Event()
    ZKClusterRuntime(zk, job_id).watch_sgroup(0, emptied.set)
    assert not emptied.wait(0.5)


def test_list_remove_removeall(zk, zk_server):
    a, b = JobManager(zk).new_job_id(), JobManager(zk).new_job_id()
    with ZKService(zk_server) as p:
        ZKClusterRuntime(p, a).register_proc("localhost:0", 10)
        ZKClusterRuntime(p, b).register_proc("localhost:0", 20)
        ZKClusterRuntime(p, b).register_proc("localhost:0", 21)
        assert JobManager(zk).list_jobs() == [(a, 1), (b, 2)]
        JobManager(zk).remove_job(b)
        assert JobManager(zk).list_jobs() == [(a, 1)]
        assert JobManager(zk).list_jobs(all=True) == [(a, 1), (b, 0)]
        assert JobManager(zk).job_procs(b) == []
        JobManager(zk).remove_all()
        assert JobManager(zk).list_jobs(all=True) == []
        with pytest.raises(ClusterError, match=rf"job {a} does not exist in ZooKeeper at {zk_server}"):
            JobManager(zk).job_procs(a)
        assert JobManager(zk).new_job_id() == b + 1         # removeall keeps the id sequence


def test_idle_jobs_are_pruned_when_more_than_ten_newer_exist(zk, zk_server):
    with ZKService(zk_server) as p:
        ids = []
        for _ in range(13):
            ids.append(JobManager(zk).new_job_id())
            ZKClusterRuntime(p, ids[-1]).register_proc("localhost:0", 1)
            JobManager(zk).remove_job(ids[-1])
        assert [j for j, _ in JobManager(zk).list_jobs(all=True)] == ids[2:]
        assert JobManager(zk).list_jobs() == []


def test_gen_hosts_round_robin_across_jobs(zk, tmp_path, raw):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# cluster\nnode0 slots=2\n\n  node1\nnode2\n")
    assert JobManager(zk).gen_hosts(hostfile, 2) == ["node0", "node1"]
    assert raw.get("/singa/sys/host-idx")[0] == b"2"
    assert JobManager(zk).gen_hosts(hostfile, 4) == ["node2", "node0", "node1", "node2"]
    assert raw.get("/singa/sys/host-idx")[0] == b"0"
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ConfigError, match="empty: no hosts listed"):
        JobManager(zk).gen_hosts(tmp_path / "empty", 1)
    with pytest.raises(ConfigError, match="missing: cannot read hostfile"):
        JobManager(zk).gen_hosts(tmp_path / "missing", 1)


def test_unreachable_zookeeper_is_a_cluster_error_not_a_hang(closed_port):
    hosts = f"127.0.0.1:{closed_port}"
    t = time.monotonic()
    with pytest.raises(ClusterError) as e:
        ZKService(hosts)
    assert time.monotonic() - t < 15
    assert str(e.value).startswith(f"cannot reach ZooKeeper at {hosts} within 15 s")
    assert "\n" not in str(e.value)
    assert not zookeeper_answers(hosts, 1)


def test_zookeeper_answers(zk_server):
    assert zookeeper_answers(zk_server, 5)
    assert not zookeeper_answers("no-such-host.invalid:2181", 1)


def test_the_check_gives_a_server_that_listens_its_whole_time_and_says_so(closed_port):
    """A server that listens but opens no session yet (one starting on a loaded machine; here a
    socket nobody accepts on): the check tries for its whole timeout (it once gave up after 3 s
    while ZooKeeper was starting), saying once what it waits for; where nothing listens and
    the caller would start a server itself (wait_refused=False), it returns at once."""
    lines = []
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        hosts = "127.0.0.1:%d" % listening.getsockname()[1]
        t = time.monotonic()
        assert not zookeeper_answers(hosts, 3, wait_refused=False, waiting=lines.append)
        took = time.monotonic() - t
    assert 3 <= took < 6, took
    assert lines == [f"waiting up to 3 s for ZooKeeper at {hosts} to open a session (it listens "
                     f"but opens no session yet)"]
    lines.clear()
    t = time.monotonic()
    assert not zookeeper_answers(f"127.0.0.1:{closed_port}", 30, wait_refused=False,
                                 waiting=lines.append)
    assert time.monotonic() - t < 2 and lines == []


def test_zk_service_start_returns_once_the_server_serves_sessions(tmp_path, closed_port):
    """zk-service.sh start waits until ZooKeeper serves (`srvr`), not only until its port
    answers `ruok` (imok comes before the server has loaded its data, and sessions asked for
    then are refused: seconds under load): a session asked for at once is not refused."""
    env = dict(os.environ, ZK_PORT=str(closed_port), ZK_DATA=str(tmp_path / "zk"),
               SINGA_MANAGES_ZK="true")
    zk_service("start", env)
    try:
        with ZKService(f"127.0.0.1:{closed_port}", timeout=30):
            pass
    finally:
        zk_service("stop", env)
    log = (tmp_path / "zk" / "zookeeper.log").read_text()
    assert "ZooKeeperServer not running" not in log, log[-3000:]


def test_operations_after_server_loss_raise_within_timeout(tmp_path, closed_port):
    """A server that goes away mid-session: calls fail with ClusterError instead of hanging."""
    env = dict(os.environ, ZK_PORT=str(closed_port), ZK_DATA=str(tmp_path / "zk"))
    zk_service("start", env)
    try:
        z = ZKService(f"127.0.0.1:{env['ZK_PORT']}")
    finally:
        zk_service("stop", env)
    z.timeout = 1      # connect patiently (busy machine), then wait briefly for the lost server
    t = time.monotonic()
    with pytest.raises(ClusterError, match=r"ZooKeeper at 127.0.0.1:\d+ did not answer within 1 s \(create job lock\)"):
        JobManager(z).new_job_id()
    assert time.monotonic() - t < 4
    z.close()


def test_a_process_gone_without_ending_normally_is_reported_lost(zk, zk_server):
    job_id = JobManager(zk).new_job_id()
    lost = []
    ZKClusterRuntime(zk, job_id).register_proc("127.0.0.1:5000", 100)
    done, killed = ZKService(zk_server), ZKService(zk_server)
    ZKClusterRuntime(done, job_id).register_proc("127.0.0.1:5001", 101)
    ZKClusterRuntime(killed, job_id).register_proc("127.0.0.1:5002", 102)
    ZKClusterRuntime(zk, job_id).watch_procs(lost.append)
    ZKClusterRuntime(done, job_id).proc_done(1)
    done.close()
    time.sleep(1)
    assert lost == []                       # ended normally: no loss
    killed.close()
    deadline = time.monotonic() + 10
    while not lost and time.monotonic() < deadline:
        time.sleep(0.1)
    assert lost == [f"process 2 of job {job_id} (127.0.0.1:5002, pid 102) was lost"]


def test_an_endpoint_once_read_is_known_with_zookeeper_away(zk, zk_server):
    """What a time-out names when ZooKeeper cannot tell: endpoints read at start-up are kept."""
    other = ZKService(zk_server)
    try:
        assert ZKClusterRuntime(other, 3).register_proc("10.1.2.3:4567", 99) == 0
        rt = ZKClusterRuntime(zk, 3)
        assert rt.known_endpoints() == {}
        assert rt.proc_endpoint(0, timeout=5) == "10.1.2.3:4567"
    finally:
        other.close()
    zk.close()      # ZooKeeper away for this process
    zk.timeout = 1
    assert rt.proc_endpoint(0, timeout=1) == "10.1.2.3:4567"
    assert rt.known_endpoints() == {0: "10.1.2.3:4567"}
    with pytest.raises(ClusterError):
        rt.proc_endpoint(1, timeout=1)
