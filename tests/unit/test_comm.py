"""Msg, format frames, Dealer/Router over real inproc ZeroMQ, and the Stub ⇄ Server protocol."""
import threading

import numpy as np
import pytest
import zmq

from singa.comm import msg as m
from singa.comm.socket import Dealer, Router
from singa.comm.stub import ParamEntry, Stub
from singa.param import Param
from singa.proto import job_pb2
from singa.server import Server
from singa.updater import create_updater
from google.protobuf import text_format


def test_addresses_pack_like_singa():
    a = m.addr(3, 7, m.kServer)
    assert a == (3 << 16) | (7 << 8) | m.kServer
    assert (m.addr_grp(a), m.addr_id(a), m.addr_type(a)) == (3, 7, m.kServer)
    stub = m.addr(-1, -1, m.kStub)
    assert m.addr_grp(stub) == -1 and m.addr_type(stub) == m.kStub
    t = m.param_trgt(12, 5)
    assert (m.param_id(t), m.slice_id(t)) == (12, 5)


def test_format_frames_round_trip_every_kind():
    arr = np.arange(3, dtype=np.float32)
    frame = m.format_frame("ifsp124", -5, 0.5, b"name", arr, 200, 60000, 4000000000)
    assert frame.startswith(b"*singa*\0")
    i, f, s, p, one, two, four = m.parse_format_frame("ifsp124", frame)
    assert (i, f, s, one, two, four) == (-5, 0.5, b"name", 200, 60000, 4000000000)
    assert p is arr          # in-process: by reference
    with pytest.raises(Exception):
        m.parse_format_frame("f", m.format_frame("i", 1))


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


def test_two_shares_make_one_averaged_update_and_both_learn_the_version():
    updater = create_updater(text_format.Parse(
        "type: kSGD learning_rate { type: kFixed base_lr: 0.5 }", job_pb2.UpdaterProto()))
    ctx = zmq.Context()
    router = Router(ctx, "inproc://test-protocol")
    server = Server(ctx, router.endpoint, 0, 0, updater, poll_ms=10)
    owner, share = Param(job_pb2.ParamProto(name="w")), Param(job_pb2.ParamProto(name="w"))
    owner.setup((2, 3)), share.setup((2, 3))
    owner.id = owner.owner = 0
    share.id, share.owner = 1, 0
    owner.data[...] = 1.0
    share.data = owner.data
    w0, w1 = (Dealer(ctx, m.addr(0, j, m.kWorkerParam), router.endpoint) for j in (0, 1))
    entry = ParamEntry(0, 0, 2, [(0, server.address, 0, 6)])
    entry.add_share(w0.address, owner)
    entry.add_share(w1.address, share)
    stub = Stub(router, m.addr(-1, -1, m.kStub), {(0, 0): entry}, nworkers=2, nservers=1, poll_ms=10)
    threads = [threading.Thread(target=x.run) for x in (server, stub)]
    for t in threads:
        t.start()
    stub_addr = m.addr(-1, -1, m.kStub)
    w0.send(m.Msg(w0.address, stub_addr, m.kPut, m.param_trgt(0, 0), 0))
    owner.grad[...] = 2.0
    share.grad[...] = 4.0
    for w in (w0, w1):
        w.send(m.Msg(w.address, stub_addr, m.kUpdate, m.param_trgt(0, 0), 0))
    answers = [w.receive(2000) for w in (w0, w1)]
    assert [a.type for a in answers] == [m.kRUpdate, m.kRUpdate]
    assert [a.trgt_version for a in answers] == [1, 1]
    assert [m.param_id(a.trgt_val) for a in answers] == [0, 1]
    # w -= lr * (g0 + g1) / num_total  = 1 - 0.5 * 6 / 2
    np.testing.assert_allclose(owner.data, -0.5)
    server.stop()
    for w in (w0, w1):
        w.send(m.Msg(w.address, stub_addr, m.kStop))
    for t in threads:
        t.join(5)
    assert not any(t.is_alive() for t in threads) and server.error is None
    w0.close(), w1.close(), server.dealer.close(), router.close(), ctx.term()
