"""comm.liveness and what a process makes of a dropped connection: a process's end is noticed
from its connection (over real tcp), told from a loss by its farewell or proc-done mark, and
reported once."""
import threading
import time

import pytest

from singa.cluster.cluster_rt import ClusterRuntime, failed_mark
from singa.comm import msg as m
from singa.comm.liveness import DOWN_GRACE, PeerWatch
from singa.comm.socket import Peer, Router
from singa.comm.stub import Stub
from singa.driver import Driver
from singa.errors import ClusterError
from singa.train.runtime import Transport
from test_runtime import make_job


class Watched:
    """A process's Transport listening on 127.0.0.1, and another's watched Peer to it."""

    def __init__(self):
        self.remote, self.local = Transport(), Transport()
        self.endpoint = self.remote.listen("127.0.0.1")
        self.peer = self.local.peer(self.endpoint, watched=True)
        self.down = []
        self.fired = threading.Event()
        self.watch = PeerWatch({3: self.peer}, self.on_down)
        self.watch.start()

    def on_down(self, pid):
        self.down.append(pid)
        self.fired.set()

    def up(self):
        """Wait for the connection's handshake (a message gets through)."""
        self.peer.send(m.Msg(0, m.STUB, m.kStop))
        assert self.remote.router.receive(5000) is not None

    def close(self):
        self.watch.close()
        self.peer.close()
        self.local.close()
        self.remote.close()


@pytest.fixture
def watched():
    w = Watched()
    yield w
    w.close()


def test_a_connection_that_drops_and_stays_down_is_reported_once(watched):
    watched.up()
    watched.remote.router.close()      # as a killed process's kernel closes its socket
    assert watched.fired.wait(5 + DOWN_GRACE)
    assert not threading.Event().wait(2 * DOWN_GRACE)       # ZeroMQ keeps retrying: no repeat
    assert watched.down == [3]


def test_a_connection_back_within_the_grace_is_no_end(watched):
    watched.up()
    port = watched.endpoint.rsplit(":", 1)[1]
    watched.remote.router.close()
    router = watched.remote.router = Router(watched.remote.ctx, "inproc://test-liveness-back")
    deadline = time.monotonic() + 5
    while True:     # the same endpoint, once the closed socket has let it go
        try:
            router.bind(f"tcp://127.0.0.1:{port}")
            break
        except ClusterError:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    watched.up()
    assert not watched.fired.wait(2 * DOWN_GRACE), watched.down


@pytest.mark.parametrize("end", ["stop", "close"])
def test_connections_dropping_after_the_watch_ends_leave_zeromq_working(watched, end):
    """A dropped connection's event still goes somewhere: a monitor whose reader has gone
    blocks ZeroMQ's I/O thread, and with it every tcp socket of the context (and its end)."""
    watched.up()
    getattr(watched.watch, end)()
    watched.remote.router.close()
    assert not watched.fired.wait(2 * DOWN_GRACE)
    router = Router(watched.local.ctx, "inproc://test-liveness-probe")
    peer = Peer(watched.local.ctx, router.bind("tcp://127.0.0.1:*"))
    try:
        peer.send(m.Msg(0, m.STUB, m.kStop))
        assert router.receive(5000) is not None
    finally:
        peer.close()
        router.close()


def test_a_peer_never_reached_is_not_reported():
    """Only a connection that has been up counts (a process that never came is ZooKeeper's
    and the registration time-out's to report)."""
    local = Transport()
    peer = local.peer("127.0.0.1:1", watched=True)     # nothing listens there
    down = []
    watch = PeerWatch({1: peer}, down.append)
    watch.start()
    try:
        assert not threading.Event().wait(2 * DOWN_GRACE)
    finally:
        watch.close()
        peer.close()
        local.close()
    assert down == []


class Sent:
    """The Peers of a stub that keeps what it sends: {procs id: [Msg]}."""

    def __init__(self):
        self.msgs = {}

    def __call__(self, pid):
        sent = self

        class Peer:
            def send(self, msg, wait=True):
                sent.msgs.setdefault(pid, []).append(msg)
        return Peer()


def test_a_farewell_reaches_every_other_stub_with_its_mark():
    peers = Sent()
    Stub(None, {}, [], pid=1, locate=lambda a: 0, peers=peers, nprocs=3).farewell("SIGHUP")
    assert sorted(peers.msgs) == [0, 2]
    other = Stub(None, {}, [], pid=2, locate=lambda a: 0, peers=Sent(), nprocs=3)
    other.handle(peers.msgs[2][0])
    assert other.members.ended == {1: "SIGHUP"}


def test_a_loss_is_reported_once_per_process_with_its_procs_id():
    stub = Stub(None, {}, [], pid=0, nprocs=3)
    assert stub.report_lost("process 2 of job 7 (h:1, pid 9) was lost", 2)
    assert not stub.report_lost("process 2 of job 7 (h:1, pid 9) failed: x", 2)
    assert stub.report_lost("ZooKeeper is unreachable", None)
    assert stub.report_lost("ZooKeeper is unreachable", None)    # None: not one process
    got = [stub.requests.get_nowait() for _ in range(3)]
    assert got[0] == ("lost", "process 2 of job 7 (h:1, pid 9) was lost", 2)
    assert [g[2] for g in got] == [2, None, None] and stub.requests.empty()


class MarkRuntime(ClusterRuntime):
    """A cluster runtime whose processes' proc-done marks are `marks` (absent: None)."""

    job_id = 7

    def __init__(self, marks):
        self.marks = marks

    def proc_mark(self, procs_id):
        return self.marks.get(procs_id)

    def proc_address(self, procs_id):
        return f"10.0.0.{procs_id}:5000, pid 9{procs_id}"

    def known_endpoints(self):
        return {p: f"10.0.0.{p}:5000" for p in range(4)}


@pytest.mark.parametrize("farewell, mark, report", [
    ("", b"failed: never read", None),                          # ended normally: no loss
    ("SIGHUP", None, "process 1 of job 7 (10.0.0.1:5000, pid 91) was stopped by SIGHUP"),
    (None, b"", None),                                          # no farewell heard, marked
    (None, failed_mark("disk full").encode(),
     "process 1 of job 7 (10.0.0.1:5000, pid 91) failed: disk full"),
    (None, None, "process 1 of job 7 (10.0.0.1:5000, pid 91) was lost"),
])
def test_a_dropped_connection_is_a_loss_unless_its_process_ended_normally(
        tmp_path, farewell, mark, report):
    driver = Driver(make_job(tmp_path), MarkRuntime({1: mark}))
    stub = Stub(None, {}, [], pid=0, nprocs=3)
    if farewell is not None:
        stub.members.ended[1] = farewell
    driver.process = type("Process", (), {"stub": stub})
    driver.on_peer_down(1)
    assert [r[1:] for r in iter_requests(stub)] == ([] if report is None else [(report, 1)])


def iter_requests(stub):
    while not stub.requests.empty():
        yield stub.requests.get_nowait()


@pytest.mark.parametrize("when", ["as the watch closes", "after it closed"])
def test_a_peer_added_as_or_after_the_watch_ends_leaves_the_context_free_to_end(when):
    """A farewell to a restarted process, sent as its process ends, connects a new watched
    Peer (`Process.peer`) while or after the watch closes: its monitor's socket is closed
    all the same, so the Transport's context terminates (it waited for ever: a job of a
    rejoined process that ended with the other groups hung at its end)."""
    remote, local = Transport(), Transport()
    endpoint = remote.listen("127.0.0.1")
    watch = PeerWatch({}, lambda pid: None)
    watch.start()
    late = local.peer(endpoint, watched=True)
    if when == "after it closed":
        watch.close()
        watch.add(1, late)
    else:
        watch.add(1, late)
        watch.closing.set()      # the thread ends before its next turn reads the queue
        watch.close()
        # close() returns at once where closing is set: the thread must not still be polling
        # as the context terminates under it (ContextTerminated in the thread, a warning)
        watch.thread.join(10)
    late.close()
    ended = threading.Thread(target=local.close, daemon=True)
    ended.start()
    ended.join(10)
    assert not ended.is_alive(), "the context waits for an unclosed socket"
    remote.close()
