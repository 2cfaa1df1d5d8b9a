"""Msg, format and array frames, Dealer/Router over real ZeroMQ, and the Stub ⇄ Server protocol."""
import threading

import numpy as np
import pytest
import zmq

from singa.comm import msg as m
from singa.comm.socket import Dealer, Peer, Router
from singa.comm.stub import ParamEntry, Stub
from singa.proto import job_pb2
from singa.server import Server
from singa.errors import ClusterError
from google.protobuf import text_format



def test_addresses_pack_like_singa():
    a = m.addr(3, 7, m.kServer)
    assert a == (3 << 16) | (7 << 8) | m.kServer
    assert (m.addr_grp(a), m.addr_id(a), m.addr_type(a)) == (3, 7, m.kServer)
    stub = m.STUB
    assert m.addr_grp(stub) == -1 and m.addr_type(stub) == m.kStub
    t = m.param_trgt(12, 5)
    assert (m.param_id(t), m.slice_id(t)) == (12, 5)


def test_format_frames_round_trip_every_kind():
    frame = m.format_frame("ifs", -5, 0.5, b"name")
    assert frame.startswith(b"*singa*\0")
    assert m.parse_format_frame("ifs", frame) == [-5, 0.5, b"name"]
    assert m.parse_error_frames(m.error_frames("DataError", "bad label")) == ("DataError",
                                                                           "bad label")
    assert m.parse_int_frame(m.int_frame([3, -1, 7])) == [3, -1, 7]
    with pytest.raises(ClusterError):
        m.parse_format_frame("f", m.format_frame("i", 1))
    with pytest.raises(ClusterError):
        m.parse_format_frame("ii", m.format_frame("i", 1))
    with pytest.raises(ClusterError):
        m.parse_int_frame(b"*singa*\0i\0")


@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_array_frames_alias_in_process_and_copy_across_tcp(transport):
    ctx = zmq.Context()
    router = Router(ctx, "inproc://test-alias" if transport == "inproc" else "tcp://127.0.0.1:*")
    src = m.addr(0, 0, m.kWorkerParam)     # across processes a Peer sends (the job id first)
    d = Dealer(ctx, src, router.endpoint) if transport == "inproc" else \
        Peer(ctx, router.endpoint)
    small, big = np.arange(3, dtype=np.float32), np.arange(100000, dtype=np.float32)
    d.send(m.Msg(src, 1, m.kPut, frames=[m.array_frame(small), m.array_frame(big)]))
    got = router.receive(2000)
    views = [m.frame_array(f, a.size) for f, a in zip(got.frames, (small, big))]
    for view, a in zip(views, (small, big)):
        np.testing.assert_array_equal(view, a)
    assert not m.same_memory(views[0], small)      # small frames are copied
    assert m.same_memory(views[1], big) == (transport == "inproc")
    with pytest.raises(ClusterError):
        m.frame_array(got.frames[0], 4)
    d.close(), router.close(), ctx.term()


def test_dealer_router_carry_header_and_frames():
    ctx = zmq.Context()
    router = Router(ctx, "inproc://test-dr")
    d = Dealer(ctx, m.addr(0, 1, m.kWorkerParam), router.endpoint)
    d.send(m.Msg(d.address, 99, m.kPut, 7, 8, [b"abc"]))
    got = router.receive(1000)
    assert (got.src, got.dst, got.type, got.trgt_val, got.trgt_version) == (d.address, 99, m.kPut, 7, 8)
    assert bytes(got.frames[0]) == b"abc"
    router.send(got.reply(m.kRGet, 9))
    back = d.receive(1000)
    assert (back.type, back.dst, back.trgt_version) == (m.kRGet, d.address, 9)
    assert d.receive(10) is None
    d.close(), router.close(), ctx.term()


UPDATER = "type: kSGD momentum: 0.9 learning_rate { type: kFixed base_lr: 0.5 }"


class Bench:
    """A Stub and a Server over real inproc sockets, and dealers standing for two workers."""

    def __init__(self, shares=2):
        self.ctx = zmq.Context()
        self.router = Router(self.ctx, f"inproc://test-protocol-{id(self)}")
        updater = text_format.Parse(UPDATER, job_pb2.UpdaterProto())
        self.server = Server(self.ctx, self.router.endpoint, 0, 0, updater, poll_ms=10)
        self.workers = [Dealer(self.ctx, m.addr(0, j, m.kWorkerParam), self.router.endpoint)
                        for j in range(shares)]
        entry = ParamEntry(0, 0, [(0, self.server.address, 0, 4), (1, self.server.address, 4, 2)])
        for j, w in enumerate(self.workers):
            entry.add_share(w.address, 10 + j)
        entry.num_total = shares
        self.stub = Stub(self.router, {(0, 0): entry},
                         [self.server.address] + [w.address for w in self.workers], poll_ms=10)
        self.threads = [threading.Thread(target=x.run, daemon=True) for x in (self.server, self.stub)]
        for t in self.threads:
            t.start()

    def send(self, j, type_, version=0, frames=()):
        w = self.workers[j]
        w.send(m.Msg(w.address, m.STUB, type_, m.param_trgt(0, 0), version, frames))

    def put(self, values):
        self.send(0, m.kPut, 0, [m.format_frame("ffi", 1, 1, -1), m.array_frame(values)])

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
    """{offset: values} of an RGet / RUpdate answer: [offsets; a frame per slice]."""
    offsets = m.parse_int_frame(answer.frames[0])
    return {o: m.frame_array(f, len(f) // 4) for o, f in zip(offsets, answer.frames[1:])}


def test_put_is_acknowledged_and_two_shares_make_one_averaged_update():
    b = Bench()
    b.put(np.ones(6, np.float32))
    assert [a.type for a in b.answers()] == [m.kRPut, m.kRPut]
    grads = [np.full(6, 2.0, np.float32), np.full(6, 4.0, np.float32)]
    for j, g in enumerate(grads):
        b.send(j, m.kUpdate, 0, [m.array_frame(g)])
    answers = b.answers()
    assert [a.type for a in answers] == [m.kRUpdate, m.kRUpdate]
    assert [a.trgt_version for a in answers] == [1, 1]
    assert [m.param_id(a.trgt_val) for a in answers] == [10, 11]
    # w -= lr * (g0 + g1) / num_total  = 1 - 0.5 * 6 / 2
    for answer in answers:
        got = values_of(answer)
        assert sorted(got) == [0, 4]
        np.testing.assert_allclose(np.concatenate([got[0], got[4]]), -0.5)
    # the sum went to buffers of the stub and server, not into a worker's gradient
    np.testing.assert_array_equal(grads[0], 2.0)
    np.testing.assert_array_equal(grads[1], 4.0)
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
    assert answer.type == m.kRState and m.parse_int_frame(answer.frames[0]) == [0, 4]
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
    b.send(0, m.kUpdate, 0, [m.array_frame(np.full(6, 2.0, np.float32))])
    answer = b.workers[0].receive(2000)
    assert answer.type == m.kRUpdate
    got = values_of(answer)     # 1 - 0.5 * 2: the bad messages changed nothing
    np.testing.assert_allclose(np.concatenate([got[0], got[4]]), 0.0)
    b.close()
