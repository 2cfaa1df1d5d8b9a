"""comm.param_msg: every param message round-trips through its parser, malformed ones are
refused without writing outside the param."""
import numpy as np
import pytest

from singa.comm import msg as m
from singa.comm import param_msg as pm
from singa.errors import ClusterError

W, S = m.addr(1, 2, m.kWorkerParam), m.addr(0, 3, m.kServer)


def wire(msg):
    """`msg` as a receiver gets it: header and frames as bytes."""
    return m.Msg.from_frames([msg.header()] + [bytes(memoryview(f)) for f in msg.frames])


def test_a_workers_put_round_trips_values_buffers_and_scales():
    values, buf = np.arange(6, dtype=np.float32), np.full(6, 7, np.float32)
    msg = wire(pm.put(W, m.STUB, 4, 9, 0.5, 2.0, 3, values, [buf]))
    assert (msg.type, m.param_id(msg.trgt_val), msg.trgt_version) == (m.kPut, 4, 9)
    lr_scale, wd_scale, lr_index, arrays = pm.parse_put(msg, 6)
    assert (lr_scale, wd_scale, lr_index) == (0.5, 2.0, 3)
    np.testing.assert_array_equal(arrays[0], values)
    np.testing.assert_array_equal(arrays[1], buf)
    with pytest.raises(ClusterError):
        pm.parse_put(msg, 5)                                   # a size other than the param's


def test_a_slice_put_carries_its_size_and_scales():
    arrays = [np.ones(3, np.float32), np.zeros(3, np.float32)]
    msg = wire(pm.slice_put(W, S, 4, 1, 9, 1.0, 0.0, 2, -1, arrays))
    assert m.slice_id(msg.trgt_val) == 1
    lr_scale, wd_scale, num_total, lr_index, values, buffers = pm.parse_slice_put(msg)
    assert (lr_scale, wd_scale, num_total, lr_index) == (1.0, 0.0, 2, -1)
    np.testing.assert_array_equal(values, 1)
    assert len(buffers) == 1
    msg.frames[0] = m.format_frame("iffii", 3, 1.0, 0.0, 0, -1)      # no shares
    with pytest.raises(ClusterError, match="malformed Put"):
        pm.parse_slice_put(msg)


def test_buckets_of_updates_round_trip_and_malformed_ones_are_refused():
    g, h = np.arange(4, dtype=np.float32), np.full(2, 3, np.float32)
    [(o1, f1), (o2, f2)] = pm.parse_update(wire(pm.update(W, m.STUB, 1, [4, 6], [g, h])))
    assert (o1, o2) == (4, 6)
    np.testing.assert_array_equal(m.frame_array(f1, 4), g)
    np.testing.assert_array_equal(m.frame_array(f2, 2), h)
    msg = wire(pm.slice_update(W, S, 1, [(4, 0, 3, g), (6, 2, 1, h)]))
    assert [(o, sid, n) for o, sid, n, _ in pm.parse_slice_update(msg)] == [(4, 0, 3), (6, 2, 1)]
    reply = wire(pm.updated(S, W, 2, [(4, 0, g), (6, 2, h)]))
    assert reply.trgt_version == 2
    assert [(o, sid) for o, sid, _ in pm.parse_updated(reply)] == [(4, 0), (6, 2)]
    np.testing.assert_array_equal(m.frame_array(pm.parse_updated(reply)[1][2][0]), h)
    with pytest.raises(ClusterError):
        m.frame_array(f1, 5)                                  # a size other than the param's
    ints = m.int_frame((4, 6))
    for parse, frames in ((pm.parse_update, []), (pm.parse_update, [ints, m.array_frame(g)]),
                          (pm.parse_update, [b"x", m.array_frame(g)]),
                          (pm.parse_slice_update, [ints, m.array_frame(g)]),
                          (pm.parse_slice_update, [m.int_frame((4, 0, 1))]),
                          (pm.parse_updated, [m.int_frame((4,)), m.array_frame(g)]),
                          (pm.parse_updated, [])):
        with pytest.raises(ClusterError):
            parse(wire(m.Msg(W, S, m.kUpdate, 0, 1, frames)))


def test_gathered_values_land_at_their_offsets_and_never_outside_the_param():
    req = m.Msg(m.addr(0, 0, m.kStub), S, m.kGet, m.param_trgt(4, 0), 1)
    answers = [pm.values_reply(req, 2, np.full(n, v, np.float32)).frames
               for n, v in ((4, 1.0), (2, 2.0))]
    msg = wire(pm.gathered(req.src, W, m.kRGet, 2, [(11, [0, 4], answers)]))
    assert (msg.dst, msg.trgt_version) == (W, 2)
    [(pid, slices)] = pm.answered(msg, 1)
    assert pid == 11
    flat = np.zeros(6, np.float32)
    pm.read_values(slices, flat, "param 'w'")
    np.testing.assert_array_equal(flat, [1, 1, 1, 1, 2, 2])
    for offsets, frames in (([0, 5], answers), ([-1, 4], answers)):
        [(_, bad)] = pm.answered(wire(pm.gathered(req.src, W, m.kRGet, 2,
                                                  [(11, offsets, frames)])), 1)
        with pytest.raises(ClusterError, match="param 'w'"):
            pm.read_values(bad, np.zeros(6, np.float32), "param 'w'")
    for ints, frames in (((11, 2, 0), answers), ((11, 1, 0), answers), ((11, 0), answers),
                         ((11, 1, 0, 12), answers)):
        with pytest.raises(ClusterError, match="malformed answer"):
            pm.answered(wire(m.Msg(S, W, m.kRGet, 0, 2, [m.int_frame(ints)] +
                                   [f for a in frames for f in a])), 1)


def test_gathered_answers_of_several_params_come_apart_param_by_param():
    one, two = [np.full(2, 1, np.float32)], [np.full(3, 2, np.float32), np.full(1, 3, np.float32)]
    msg = wire(pm.gathered(S, W, m.kRUpdate, 5,
                           [(11, [0], [one]), (12, [0, 3], [two[:1], two[1:]])]))
    (p1, s1), (p2, s2) = pm.answered(msg, 1)
    assert (p1, p2) == (11, 12) and [o for o, _ in s1] == [0] and [o for o, _ in s2] == [0, 3]
    flat = np.zeros(4, np.float32)
    pm.read_values(s2, flat, "param 'v'")
    np.testing.assert_array_equal(flat, [2, 2, 2, 3])


def test_gathered_updater_state_is_reassembled_per_buffer():
    req = m.Msg(m.addr(0, 0, m.kStub), S, m.kState, m.param_trgt(4, 0), 1)
    parts = [pm.state_reply(req, 2, 5, [np.full(n, v, np.float32), np.full(n, -v, np.float32)])
             .frames for n, v in ((4, 1.0), (2, 2.0))]
    msg = wire(pm.gathered(req.src, W, m.kRState, 2, [(11, [0, 4], parts)]))
    [(_, slices)] = pm.answered(msg, None)
    lr_index, bufs = pm.read_state(slices, (2, 3), "param 'w'")
    assert lr_index == 5 and [b.shape for b in bufs] == [(2, 3), (2, 3)]
    np.testing.assert_array_equal(bufs[0].ravel(), [1, 1, 1, 1, 2, 2])
    np.testing.assert_array_equal(bufs[1].ravel(), [-1, -1, -1, -1, -2, -2])


def test_the_puts_answer_says_which_slices_dropped_the_updater_buffers_put():
    req = m.Msg(m.addr(0, 0, m.kStub), S, m.kPut, m.param_trgt(4, 0), 1)
    answers = [pm.put_reply(req, 1, 1, dropped).frames for dropped in (False, True)]
    msg = wire(pm.gathered(req.src, W, m.kRPut, 1, [(11, [0, 4], answers)]))
    assert msg.type == m.kRPut and pm.read_put_reply(pm.answered(msg, 1)[0][1]) == (1, True)
    kept = wire(pm.gathered(req.src, W, m.kRPut, 1, [(11, [0], answers[:1])]))
    assert pm.read_put_reply(pm.answered(kept, 1)[0][1]) == (1, False)


def test_sync_messages_round_trip():
    d = np.arange(3, dtype=np.float32)
    msg = wire(pm.sync(S, m.addr(1, 3, m.kServer), m.kSyncRequest, m.param_trgt(4, 1), 7, d))
    np.testing.assert_array_equal(pm.parse_sync(msg, 3), d)
    with pytest.raises(ClusterError):
        pm.parse_sync(wire(m.Msg(S, S, m.kSyncResponse, 0, 0)), 3)
