"""singa.cluster.zk and job_manager against a real ZooKeeper: SINGA's znode layout, ids, listing."""
import os
import socket
import threading
import time

import pytest

from conftest import zk_service, zookeeper
from singa.cluster.cluster_rt import ZKClusterRuntime
from singa.cluster.job_manager import JobManager
from singa.comm.trust import JobTrust, new_secret
from singa.errors import ClusterError, ConfigError
from kazoo.protocol.states import KazooState

from singa.cluster.zk import ZKService, job_path, zookeeper_answers


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory):
    """This module's own ZooKeeper: its tests list every job, so no other module's may be there
    (jobs killed elsewhere stay, their nodes protected)."""
    yield from zookeeper(tmp_path_factory)


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
    assert str(e.value) == f"cannot reach ZooKeeper at {hosts} ({hosts} Connection refused)"
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


class StallingProxy:
    """127.0.0.1:`port` in front of the ZooKeeper at `target` (host, port): it forwards, but
    `cut(n)` breaks every connection and holds the next `n` unanswered (accepted, never
    read from): what a ZooKeeper that is starting does to a connect."""

    def __init__(self, target):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stall, self.socks, self.lock = 0, [], threading.Lock()
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:     # closed
                return
            with self.lock:
                self.socks.append(client)
                if self.stall > 0:
                    self.stall -= 1
                    continue
                server = socket.create_connection(self.target)
                self.socks.append(server)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    def cut(self, stall):
        with self.lock:
            self.stall = stall
            for s in self.socks:
                end(s)
            self.socks = []

    def close(self):
        self.listener.close()
        self.cut(0)


def pump(a, b):
    """Copy what `a` receives to `b` until either ends; then end both."""
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    end(a)
    end(b)


def end(s):
    try:
        s.shutdown(socket.SHUT_RDWR)    # wakes a thread blocked in recv (close would not)
    except OSError:
        pass
    s.close()


def test_a_session_outlives_connects_that_a_starting_server_does_not_answer(zk_server, raw):
    """After an outage, a reconnect can reach a ZooKeeper that is starting: it accepts the
    connection and never answers (CI: a process reconnected so, waited the whole 10 s session
    timeout for the answer, its session expired, and the job took it for lost). Two such
    connects in a row, then a server that answers: the session and its ephemeral node live on,
    since a connect is given up on after a quarter of the session timeout (before: after all
    of it; two of them outlast the session)."""
    host, port = zk_server.rsplit(":", 1)
    proxy = StallingProxy((host, int(port)))
    z = ZKService(f"127.0.0.1:{proxy.port}")
    try:
        states = []
        z.client.add_listener(states.append)
        path = "/stalled-" + str(os.getpid())
        z.client.create(path, ephemeral=True)
        session = z.client.client_id[0]
        z.client.exists(path)   # the server's last word with the session: now
        proxy.cut(stall=2)
        deadline = time.monotonic() + 40
        while KazooState.CONNECTED not in states and time.monotonic() < deadline:
            time.sleep(0.1)
        assert states[0] == KazooState.SUSPENDED and KazooState.CONNECTED in states, states
        assert KazooState.LOST not in states, states
        assert z.client.client_id[0] == session
        assert raw.exists(path) is not None
    finally:
        z.close()
        proxy.close()
