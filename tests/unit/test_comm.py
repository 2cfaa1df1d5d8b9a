"""Msg, format and array frames, Dealer/Router over real ZeroMQ."""
import numpy as np
import pytest
import zmq

from singa.comm import msg as m
from singa.comm.socket import Dealer, Peer, Router
from singa.errors import ClusterError



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
    assert m.parse_int_frame(m.int_frame((3, -1, 7))) == (3, -1, 7)
    with pytest.raises(ClusterError):
        m.parse_format_frame("f", m.format_frame("i", 1))
    with pytest.raises(ClusterError):
        m.parse_format_frame("ii", m.format_frame("i", 1))
    with pytest.raises(ClusterError):
        m.parse_int_frame(b"*singa*\0i\0")


def test_format_frames_of_numbers_hold_the_items_bytes_and_name_a_wrong_one():
    frame = m.format_frame("iffii", 3, 0.5, -0.0, -1, 2**31 - 1)
    assert frame == b"*singa*\0i\3\0\0\0f\0\0\0\x3ff\0\0\0\x80i\xff\xff\xff\xffi\xff\xff\xff\x7f"
    assert m.parse_format_frame("iffii", frame + b"more") == [3, 0.5, -0.0, -1, 2**31 - 1]
    with pytest.raises(ClusterError, match="expected 'i' at byte 18"):
        m.parse_format_frame("ifi", frame)
    with pytest.raises(ClusterError, match="expected .i. at byte 33"):
        m.parse_format_frame("iffiii", frame)


def test_same_memory_is_the_same_start_whatever_the_dtype_or_alignment():
    buf = np.zeros(64, np.uint8)

    def at(offset, dtype=np.float32, n=4):
        return np.frombuffer(buf.data, dtype, n, offset)

    def starts_together(a, b):
        return a.__array_interface__["data"][0] == b.__array_interface__["data"][0]

    pairs = [(at(0), at(0)), (at(0), at(4)), (at(8), at(8, n=1)), (at(2), at(2)),
             (at(2), at(4)), (at(0), at(0, np.int32)), (at(0), at(0, np.float64, 2)),
             (at(4, n=2), at(0, np.float64, 2)), (at(0), at(0)[::-1]), (at(0, n=0), at(0)),
             (at(0).reshape(2, 2), at(0))]
    for a, b in pairs:
        assert m.same_memory(a, b) == starts_together(a, b)
    assert [m.same_memory(a, b) for a, b in pairs] == [True, False, True, True, False,
                                                       True, True, False, False, True, True]


@pytest.mark.parametrize("transport", ["inproc", "tcp"])
def test_array_frames_alias_in_process_and_copy_across_tcp(transport):
    ctx = zmq.Context()
    router = Router(ctx, "inproc://test-alias" if transport == "inproc" else "tcp://127.0.0.1:*")
    src = m.addr(0, 0, m.kWorkerParam)     # across processes a Peer sends (the job id first)
    d = Dealer(src, router.endpoint) if transport == "inproc" else \
        Peer(ctx, router.endpoint)
    small, big = np.arange(3, dtype=np.float32), np.arange(100000, dtype=np.float32)
    d.send(m.Msg(src, 1, m.kPut, frames=[m.array_frame(small), m.array_frame(big)]))
    got = router.receive(2000)
    views = [m.frame_array(f, a.size) for f, a in zip(got.frames, (small, big))]
    for view, a in zip(views, (small, big)):
        np.testing.assert_array_equal(view, a)
    for view, a in zip(views, (small, big)):     # in-process every array is handed over
        assert m.same_memory(view, a) == (transport == "inproc")
    with pytest.raises(ClusterError):
        m.frame_array(got.frames[0], 4)
    with pytest.raises(ClusterError):
        m.frame_array(np.arange(3.0), 3)        # float64
    d.close(), router.close(), ctx.term()


def test_dealer_router_carry_header_and_frames():
    ctx = zmq.Context()
    router = Router(ctx, "inproc://test-dr")
    d = Dealer(m.addr(0, 1, m.kWorkerParam), router.endpoint)
    d.send(m.Msg(d.address, 99, m.kPut, 7, 8, [b"abc"]))
    got = router.receive(1000)
    assert (got.src, got.dst, got.type, got.trgt_val, got.trgt_version) == (d.address, 99, m.kPut, 7, 8)
    assert bytes(got.frames[0]) == b"abc"
    router.send(got.reply(m.kRGet, 9))
    back = d.receive(1000)
    assert (back.type, back.dst, back.trgt_version) == (m.kRGet, d.address, 9)
    assert d.receive(10) is None
    d.close(), router.close(), ctx.term()
