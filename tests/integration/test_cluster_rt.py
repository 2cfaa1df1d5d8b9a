"""cluster_rt.ZKClusterRuntime against a real ZooKeeper: process ids and endpoints, group
membership and its watches, lost processes."""
import threading
import time

import pytest

from conftest import zookeeper
from singa.cluster.cluster_rt import MAX_REASON, ZKClusterRuntime, failed_mark
from singa.cluster.job_manager import JobManager
from singa.cluster.zk import ZKService, job_path
from singa.errors import ClusterError


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory):
    """This module's own ZooKeeper: its tests list every job, so no other module's may be there
    (jobs killed elsewhere stay, their nodes protected)."""
    yield from zookeeper(tmp_path_factory)


def test_registration_gives_procs_ids_in_order_with_singa_values(zk, zk_server, raw):
    job_id = JobManager(zk).new_job_id()
    assert job_path(job_id) == f"/singa/app/job-{job_id:010d}"
    others = [ZKService(zk_server) for _ in range(2)]
    try:
        ids = [ZKClusterRuntime(zk, job_id).register_proc("localhost:0", 111)]
        ids += [ZKClusterRuntime(o, job_id).register_proc(f"host{i}:6723", 222 + i) for i, o in enumerate(others)]
        assert ids == [0, 1, 2]
        job = f"/singa/app/job-{job_id:010d}"
        assert sorted(raw.get_children(job)) == ["group", "proc", "proc-done", "proc-lock",
                                                   "proc-lost"]
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


def test_a_process_gone_without_ending_normally_is_reported_lost(zk, zk_server):
    job_id = JobManager(zk).new_job_id()
    lost = []
    ZKClusterRuntime(zk, job_id).register_proc("127.0.0.1:5000", 100)
    done, killed = ZKService(zk_server), ZKService(zk_server)
    ZKClusterRuntime(done, job_id).register_proc("127.0.0.1:5001", 101)
    ZKClusterRuntime(killed, job_id).register_proc("127.0.0.1:5002", 102)
    ZKClusterRuntime(zk, job_id).watch_procs(lambda text, procs_id: lost.append((text, procs_id)))
    ZKClusterRuntime(done, job_id).proc_done(1)
    done.close()
    time.sleep(1)
    assert lost == []                       # ended normally: no loss
    killed.close()
    deadline = time.monotonic() + 10
    while not lost and time.monotonic() < deadline:
        time.sleep(0.1)
    assert lost == [(f"process 2 of job {job_id} (127.0.0.1:5002, pid 102) was lost", 2)]


def test_a_process_that_stopped_on_an_error_is_reported_with_its_reason(zk, zk_server):
    """Its proc-done mark says why (a full disk): the others name it, not "was lost"."""
    job_id = JobManager(zk).new_job_id()
    lost = []
    ZKClusterRuntime(zk, job_id).register_proc("127.0.0.1:5000", 100)
    failed = ZKService(zk_server)
    ZKClusterRuntime(failed, job_id).register_proc("127.0.0.1:5001", 101)
    rt = ZKClusterRuntime(zk, job_id)
    rt.proc_endpoint(1)
    rt.watch_procs(lambda text, procs_id: lost.append((text, procs_id)))
    why = "/ws/checkpoint: No space left on device " + "x" * 600
    ZKClusterRuntime(failed, job_id).proc_done(1, failed_mark(why))
    failed.close()
    deadline = time.monotonic() + 10
    while not lost and time.monotonic() < deadline:
        time.sleep(0.1)
    head = f"process 1 of job {job_id} (127.0.0.1:5001, pid 101) failed: /ws/checkpoint: No space"
    (text, procs_id), = lost
    assert text.startswith(head) and procs_id == 1, lost
    assert len(text) < len(head) + MAX_REASON        # a peer's text, bounded
    # what a dropped connection's judge reads
    assert rt.proc_mark(1) == failed_mark(why).encode() and rt.proc_mark(0) is None
    assert rt.proc_address(1) == "127.0.0.1:5001, pid 101"


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


def test_a_lost_process_that_rejoins_is_reported_back(zk, zk_server):
    """A restarted process re-registers its procs id (its old mark deleted, its old node
    waited for): the watch reports the loss with the procs id, then the return."""
    job_id = JobManager(zk).new_job_id()
    events = []
    ZKClusterRuntime(zk, job_id).register_proc("127.0.0.1:5000", 100)
    first = ZKService(zk_server)
    ZKClusterRuntime(first, job_id).register_proc("127.0.0.1:5001", 101)
    ZKClusterRuntime(first, job_id).proc_done(1, failed_mark("disk full"))
    ZKClusterRuntime(zk, job_id).watch_procs(lambda text, pid: events.append((pid, text)),
                                             lambda pid: events.append((pid, "back")))
    first.close()
    deadline = time.monotonic() + 10
    while not events and time.monotonic() < deadline:
        time.sleep(0.05)
    again = ZKService(zk_server)
    assert ZKClusterRuntime(again, job_id).register_proc("127.0.0.1:5002", 102, 1,
                                                         rejoin=True) == 1
    while len(events) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert events == [(1, f"process 1 of job {job_id} (127.0.0.1:5001, pid 101) failed: "
                          f"disk full"), (1, "back")]
    ZKClusterRuntime(again, job_id).proc_done(1)     # its own mark, not the old one
    again.close()
    time.sleep(1)
    assert len(events) == 2
