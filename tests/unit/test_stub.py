"""comm.stub: the stub talks to the servers as itself and routes their answers by address; the
Stub ⇄ Server protocol (Put, Get, Update, State) over real inproc sockets."""
import contextlib
import threading
import time

import numpy as np
import pytest
import zmq
from google.protobuf import text_format

from singa.comm import msg as m
from singa.comm import param_msg as pm
from singa.comm.membership import Membership
from singa.comm.param_table import ParamEntry
from singa.comm.socket import Dealer, Router
from singa.comm.stub import Stub
from singa.proto import job_pb2
from singa.train.server import Server

UPDATER = "type: kSGD momentum: 0.9 learning_rate { type: kFixed base_lr: 0.5 }"


def test_the_stub_asks_the_servers_as_itself_and_routes_their_answers_by_its_address():
    """SINGA's stub sends as Addr(grp, procs_id, kStub); a server answers that address. The
    updater state goes only to the worker that asked for it."""
    ctx = zmq.Context()
    router = Router(ctx, "inproc://test-param-msg-stub")
    server = Dealer(m.addr(0, 0, m.kServer), router.endpoint)
    workers = [Dealer(m.addr(0, j, m.kWorkerParam), router.endpoint) for j in range(2)]
    entry = ParamEntry(0, 4, [(0, server.address, 0, 3)])
    for j, w in enumerate(workers):
        entry.add_share(w.address, 10 + j)
    entry.num_total = 2
    stub = Stub(router, {(0, 4): entry}, [server.address] + [w.address for w in workers],
                poll_ms=10, pid=7)
    thread = threading.Thread(target=stub.run, daemon=True)
    thread.start()
    try:
        workers[1].send(pm.request(workers[1].address, m.STUB, m.kState, 4, 5))
        req = server.receive(2000)
        assert req.src == m.addr(0, 7, m.kStub) == stub.address(0)
        assert req.type == m.kState and req.trgt_val == m.param_trgt(4, 0)
        server.send(pm.state_reply(req, 5, 2, [np.ones(3, np.float32)]))
        answer = workers[1].receive(2000)
        assert answer.type == m.kRState and [pid for pid, _ in pm.answered(answer, None)] == [11]
        assert workers[0].receive(200) is None          # it did not ask
        for w in workers:
            w.send(pm.update(w.address, m.STUB, 5, [4], [np.ones(3, np.float32)]))
        req = server.receive(2000)
        [(owner, sid, num_local, grad)] = pm.parse_slice_update(req)
        assert req.src == stub.address(0) and (owner, sid, num_local) == (4, 0, 2)
        np.testing.assert_array_equal(m.frame_array(grad), 2)      # the shares' sum
        server.send(pm.updated(server.address, req.src, 6, [(4, 0, np.zeros(3, np.float32))]))
        answers = [w.receive(2000) for w in workers]
        assert [(a.type, a.trgt_version) for a in answers] == [(m.kRUpdate, 6)] * 2
        assert [pm.answered(a, 1)[0][0] for a in answers] == [10, 11]
    finally:
        stub.stop()
        for w in workers:
            w.send(m.Msg(w.address, m.STUB, m.kStop))
        server.send(m.Msg(server.address, m.STUB, m.kStop))
        thread.join(5)
        for d in workers + [server]:
            d.close()
        router.close()
        ctx.term()
    assert not thread.is_alive()


class Bench:
    """A Stub and a Server over real inproc sockets, and dealers standing for two workers."""

    def __init__(self, shares=2):
        self.ctx = zmq.Context()
        self.router = Router(self.ctx, f"inproc://test-protocol-{id(self)}")
        updater = text_format.Parse(UPDATER, job_pb2.UpdaterProto())
        self.server = Server(self.router.endpoint, 0, 0, updater, poll_ms=10)
        self.workers = [Dealer(m.addr(0, j, m.kWorkerParam), self.router.endpoint)
                        for j in range(shares)]
        entry = ParamEntry(0, 0, [(0, self.server.address, 0, 4), (1, self.server.address, 4, 2)])
        second = ParamEntry(0, 1, [(2, self.server.address, 0, 3)])   # a param of one slice
        for j, w in enumerate(self.workers):
            entry.add_share(w.address, 10 + j)
            second.add_share(w.address, 20 + j)
        entry.num_total = second.num_total = shares
        self.stub = Stub(self.router, {(0, 0): entry, (0, 1): second},
                         [self.server.address] + [w.address for w in self.workers], poll_ms=10)
        self.threads = [threading.Thread(target=x.run, daemon=True) for x in (self.server, self.stub)]
        for t in self.threads:
            t.start()

    def send(self, j, type_, version=0, frames=()):
        w = self.workers[j]
        w.send(m.Msg(w.address, m.STUB, type_, m.param_trgt(0, 0), version, frames))

    def put(self, values, owner=0):
        w = self.workers[0]
        w.send(pm.put(w.address, m.STUB, owner, 0, 1, 1, -1, values))

    def update(self, j, grads, version=0):
        """Worker j's Update of a bucket: {owner: gradient}."""
        w = self.workers[j]
        w.send(pm.update(w.address, m.STUB, version, list(grads), list(grads.values())))

    def answers(self):
        return [w.receive(2000) for w in self.workers]

    def close(self):
        for j in range(len(self.workers)):
            self.send(j, m.kStop)
        for t in self.threads:
            t.join(5)
        assert not any(t.is_alive() for t in self.threads)
        for w in self.workers:
            w.close()
        self.server.dealer.close(), self.router.close(), self.ctx.term()


def values_of(answer):
    """{offset: values} of an RGet / RUpdate answer for one param."""
    [(_, slices)] = pm.answered(answer, 1)
    return {o: m.frame_array(f) for o, (f,) in slices}


def test_put_is_acknowledged_and_two_shares_make_one_averaged_update():
    b = Bench()
    b.put(np.ones(6, np.float32))
    assert [a.type for a in b.answers()] == [m.kRPut, m.kRPut]
    grads = [np.full(6, 2.0, np.float32), np.full(6, 4.0, np.float32)]
    for j, g in enumerate(grads):
        b.update(j, {0: g})
    answers = b.answers()
    assert [a.type for a in answers] == [m.kRUpdate, m.kRUpdate]
    assert [a.trgt_version for a in answers] == [1, 1]
    assert [pm.answered(a, 1)[0][0] for a in answers] == [10, 11]
    # w -= lr * (g0 + g1) / num_total  = 1 - 0.5 * 6 / 2
    for answer in answers:
        got = values_of(answer)
        assert sorted(got) == [0, 4]
        np.testing.assert_allclose(np.concatenate([got[0], got[4]]), -0.5)
    # the sum went to buffers of the stub and server, not into a worker's gradient
    np.testing.assert_array_equal(grads[0], 2.0)
    np.testing.assert_array_equal(grads[1], 4.0)
    b.close()


def test_a_bucket_of_params_travels_as_one_message_each_way():
    """Two workers' buckets of two params (three slices on one server): the server gets one
    Update of the three slices, once both workers' gradients have come, and answers it once;
    each worker gets one answer with both params."""
    b = Bench()
    b.put(np.ones(6, np.float32))
    b.put(np.ones(3, np.float32), owner=1)
    assert [w.receive(2000).type for w in b.workers for _ in range(2)] == [m.kRPut] * 4
    seen = []
    handle = b.server.handle
    b.server.handle = lambda msg: (seen.append((msg.type, msg.src)), handle(msg))
    for j in range(2):
        b.update(j, {0: np.full(6, 2.0 + j, np.float32), 1: np.full(3, 4.0 * j, np.float32)})
    answers = b.answers()
    assert seen == [(m.kUpdate, b.stub.address(0))]
    for j, answer in enumerate(answers):
        assert (answer.type, answer.trgt_version) == (m.kRUpdate, 1)
        (p0, s0), (p1, s1) = pm.answered(answer, 1)
        assert (p0, p1) == (10 + j, 20 + j) and [o for o, _ in s0] == [0, 4]
        np.testing.assert_allclose(np.concatenate([m.frame_array(f) for _, (f,) in s0]),
                                   1 - 0.5 * 5 / 2)
        np.testing.assert_allclose(m.frame_array(s1[0][1][0]), 1 - 0.5 * 4 / 2)
    assert b.workers[0].receive(100) is None
    b.close()


def test_get_waits_for_the_put_and_answers_with_values():
    b = Bench(shares=1)
    b.send(0, m.kGet, 0)
    assert b.workers[0].receive(100) is None       # no slice yet: the Get waits
    values = np.arange(6, dtype=np.float32)
    b.put(values)
    types = sorted(b.workers[0].receive(2000).type for _ in range(2))
    assert types == sorted([m.kRPut, m.kRGet])
    b.close()


def test_state_request_gathers_every_slice_of_the_updater_state():
    b = Bench(shares=1)
    b.put(np.zeros(6, np.float32))
    b.workers[0].receive(2000)
    b.send(0, m.kState, 0)
    answer = b.workers[0].receive(2000)
    assert answer.type == m.kRState and m.parse_int_frame(answer.frames[0]) == (10, 2, 0, 4)
    assert len(answer.frames) == 1 + 2 * 2        # per slice: lr index, SGD's one buffer
    b.close()


@pytest.mark.parametrize("frames", [
    [b"garbage"], [], [m.format_frame("iffii", 4, 1, 1, 1, -1)],
    [m.format_frame("iffii", 4, 1, 1, 1, -1), b"abc"],
    [m.format_frame("iffii", 99, 1, 1, 1, -1), np.zeros(4, np.float32)]])
def test_server_drops_malformed_puts_and_keeps_serving(frames):
    b = Bench(shares=1)
    values = np.ones(6, np.float32)
    b.put(values)
    b.workers[0].receive(2000)
    w = b.workers[0]
    w.send(m.Msg(w.address, b.server.address, m.kPut, m.param_trgt(0, 0), 0, frames))
    w.send(m.Msg(w.address, b.server.address, m.kUpdate, m.param_trgt(0, 0), 0, [b"x"]))
    b.update(0, {0: np.full(6, 2.0, np.float32)})
    answer = b.workers[0].receive(2000)
    assert answer.type == m.kRUpdate
    got = values_of(answer)     # 1 - 0.5 * 2: the bad messages changed nothing
    np.testing.assert_allclose(np.concatenate([got[0], got[4]]), 0.0)
    b.close()


def until(done, seconds=2.0):
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)


@contextlib.contextmanager
def elastic_stub(name, nprocs, members):
    """Process 0's stub running in a thread with a local worker (0, 0) and process 1's stub
    at its router; yields (stub, worker, remote, sent, thread), `sent` the (procs id, type) of
    what went to other processes. On the way out the worker stops and everything closes."""
    ctx = zmq.Context()
    router = Router(ctx, f"inproc://{name}")
    worker = Dealer(m.addr(0, 0, m.kWorkerParam), router.endpoint)
    remote = Dealer(m.addr(0, 1, m.kStub), router.endpoint)
    sent = []

    class Peer:
        def __init__(self, pid):
            self.pid = pid

        def send(self, msg):
            sent.append((self.pid, msg.type))

    stub = Stub(router, {}, [worker.address], poll_ms=10, pid=0, locate=lambda a: 0,
                peers=Peer, nprocs=nprocs, members=members)
    thread = threading.Thread(target=stub.run, daemon=True)
    thread.start()
    try:
        yield stub, worker, remote, sent, thread
    finally:
        worker.send(m.Msg(worker.address, m.STUB, m.kStop))
        thread.join(5)
        worker.close(), remote.close(), router.close()
        ctx.term()


def test_an_elastic_process_away_is_sent_nothing_until_it_returns_and_too_long_away_stops():
    """The loss of an elastic process (issue 31) does not stop the stub: nothing goes to it
    until a message of its restart arrives (then everything does), and one that stays away
    past `rejoin_timeout` stops the stub with the loss named."""
    forgot = []
    members = Membership({1, 2}, forget=forgot.append, returned=lambda pid: True,
                         rejoin_timeout=1.0)
    with elastic_stub("test-elastic-stub", 3, members) as (stub, worker, remote, sent, thread):
        stub.report_lost("process 1 of job 3 (h:1, pid 9) was lost", 1)
        stub.request_snapshot(50)
        assert worker.receive(2000).type == m.kSnapshot
        until(lambda: sent)         # the peers are told after the local workers
        assert sent == [(2, m.kSnapshot)] and forgot == [1]
        remote.send(m.Msg(m.addr(0, 1, m.kStub), m.addr(0, 0, m.kStub), m.kSnapshot, 0, 60))
        assert worker.receive(2000).trgt_version == 60
        until(lambda: len(sent) == 4)      # back: told of the snapshot at 50, then of 60
        assert sent[1:] == [(1, m.kSnapshot)] * 2 + [(2, m.kSnapshot)] and forgot == [1]
        assert thread.is_alive() and stub.error is None
        stub.report_lost("process 2 of job 3 (h:2, pid 10) was lost", 2)
        assert worker.receive(3000).type == m.kStop
        assert stub.error == ("ClusterError", "process 2 of job 3 (h:2, pid 10) was lost, and "
                                              "did not rejoin within 1 s")
    assert not thread.is_alive()


def test_the_late_messages_of_a_process_taken_for_lost_are_dropped_until_its_restart():
    """A process woken from a freeze shorter than its ZooKeeper session sends on at its old
    endpoint: nothing of it counts (the bug: its late Updates reached the servers) until a
    message of its restart (`returned`) arrives."""
    restarted = []
    members = Membership({1}, forget=lambda pid: None, returned=lambda pid: bool(restarted))
    with elastic_stub("test-stub-late", 2, members) as (stub, worker, remote, _, _):
        stub.report_lost("process 1 of job 3 (h:1, pid 9) was lost", 1)
        until(lambda: 1 in stub.members.away)
        remote.send(m.Msg(m.addr(0, 1, m.kStub), m.addr(0, 0, m.kStub), m.kSnapshot, 0, 60))
        assert worker.receive(500) is None and 1 in stub.members.away
        restarted.append(1)
        remote.send(m.Msg(m.addr(0, 1, m.kStub), m.addr(0, 0, m.kStub), m.kSnapshot, 0, 70))
        assert worker.receive(2000).trgt_version == 70 and not stub.members.away


def test_a_job_stopping_for_a_snapshot_does_not_wait_for_a_process_away():
    """SIGUSR1 (a snapshot, then the job stops) while an elastic process is away: nothing
    restarts it, so a local server stops once its present workers have said farewell (the
    bug: it waited for the away process's workers the whole rejoin_timeout, 60 s)."""
    ctx = zmq.Context()
    router = Router(ctx, "inproc://test-stub-snapshot-away")
    server = Dealer(m.addr(0, 0, m.kServer), router.endpoint)
    here, away = m.addr(0, 0, m.kWorkerParam), m.addr(1, 0, m.kWorkerParam)
    worker = Dealer(here, router.endpoint)
    stub = Stub(router, {}, [server.address, here], poll_ms=10, pid=0,
                locate=lambda a: 1 if a == away else 0, peers=lambda pid: None, nprocs=2,
                farewells={here: [server.address]}, served={server.address: [here, away]},
                members=Membership({1}, forget=lambda pid: None, returned=lambda pid: False,
                                   rejoin_timeout=30.0))
    thread = threading.Thread(target=stub.run, daemon=True)
    thread.start()
    try:
        assert server.receive(2000).type == m.kConnect
        stub.report_lost("process 1 of job 3 (h:1, pid 9) was lost", 1)
        until(lambda: 1 in stub.members.away)
        stub.request_snapshot(50)
        assert worker.receive(2000).type == m.kSnapshot
        worker.send(m.Msg(here, m.STUB, m.kStop))       # it stopped after the snapshot
        told = [server.receive(2000) for _ in range(2)]
        assert [(t.src, t.type) for t in told] == [(here, m.kStop), (m.STUB, m.kStop)]
        server.send(m.Msg(server.address, m.STUB, m.kStop))
        thread.join(5)
        assert not thread.is_alive() and stub.error is None
    finally:
        stub.stop()
        thread.join(5)
        server.close(), worker.close(), router.close()
        ctx.term()


def test_workers_join_their_servers_and_only_one_that_ends_on_its_own_says_farewell():
    """As the stub starts each local worker joins its servers (kConnect); a worker that ends
    on its own says farewell (kStop), one the stub stops (a signal, a failure) does not: its
    process may restart and rejoin. Both carry the process's incarnation."""
    ctx = zmq.Context()
    router = Router(ctx, "inproc://test-stub-farewells")
    server = Dealer(m.addr(0, 0, m.kServer), router.endpoint)
    ends, stopped = (Dealer(m.addr(0, j, m.kWorkerParam), router.endpoint) for j in range(2))
    stub = Stub(router, {}, [server.address, ends.address, stopped.address], poll_ms=10,
                farewells={ends.address: [server.address], stopped.address: [server.address]})
    stub.incarnation = 7
    thread = threading.Thread(target=stub.run, daemon=True)
    thread.start()
    try:
        told = [server.receive(2000) for _ in range(2)]
        assert [(t.src, t.type, t.trgt_version) for t in told] == \
            [(ends.address, m.kConnect, 7), (stopped.address, m.kConnect, 7)]
        ends.send(m.Msg(ends.address, m.STUB, m.kStop))
        told = server.receive(2000)
        assert (told.src, told.type, told.trgt_version) == (ends.address, m.kStop, 7)
        stub.stop()
        assert stopped.receive(2000).type == m.kStop
        stopped.send(m.Msg(stopped.address, m.STUB, m.kStop))
        assert server.receive(2000).src == m.STUB
        server.send(m.Msg(server.address, m.STUB, m.kStop))
        thread.join(5)
        told = []
        while (msg := server.receive(100)) is not None:
            told.append(msg)
        assert all(t.src == m.STUB for t in told), told     # the stub's stops, no farewell
    finally:
        stub.stop()
        thread.join(5)
        for d in (server, ends, stopped):
            d.close()
        router.close()
        ctx.term()
    assert not thread.is_alive()
