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


def test_updates_round_trip_and_a_gradient_of_the_wrong_size_is_refused():
    g = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(pm.parse_update(wire(pm.update(W, m.STUB, 4, 1, g)), 4), g)
    num_local, got = pm.parse_slice_update(wire(pm.slice_update(W, S, 4, 0, 1, 3, g)), 4)
    assert num_local == 3
    np.testing.assert_array_equal(got, g)
    for bad in (lambda: pm.parse_update(wire(pm.update(W, m.STUB, 4, 1, g)), 5),
                lambda: pm.parse_slice_update(wire(m.Msg(W, S, m.kUpdate, 0, 1, [b"x"])), 4)):
        with pytest.raises(ClusterError):
            bad()


def test_gathered_values_land_at_their_offsets_and_never_outside_the_param():
    req = m.Msg(m.addr(0, 0, m.kStub), S, m.kGet, m.param_trgt(4, 0), 1)
    answers = [pm.values_reply(req, m.kRGet, 2, np.full(n, v, np.float32)).frames
               for n, v in ((4, 1.0), (2, 2.0))]
    msg = wire(pm.gathered(req.src, W, m.kRGet, 11, 2, [0, 4], answers))
    assert (msg.dst, m.param_id(msg.trgt_val), msg.trgt_version) == (W, 11, 2)
    flat = np.zeros(6, np.float32)
    pm.read_values(msg, flat, "param 'w'")
    np.testing.assert_array_equal(flat, [1, 1, 1, 1, 2, 2])
    for offsets, frames in (([0, 5], answers), ([0], answers), ([-1, 4], answers)):
        bad = wire(pm.gathered(req.src, W, m.kRGet, 11, 2, offsets, frames))
        with pytest.raises(ClusterError, match="param 'w'"):
            pm.read_values(bad, np.zeros(6, np.float32), "param 'w'")


def test_gathered_updater_state_is_reassembled_per_buffer():
    req = m.Msg(m.addr(0, 0, m.kStub), S, m.kState, m.param_trgt(4, 0), 1)
    parts = [pm.state_reply(req, 2, 5, [np.full(n, v, np.float32), np.full(n, -v, np.float32)])
             .frames for n, v in ((4, 1.0), (2, 2.0))]
    msg = wire(pm.gathered(req.src, W, m.kRState, 11, 2, [0, 4], parts))
    lr_index, bufs = pm.read_state(msg, (2, 3), "param 'w'")
    assert lr_index == 5 and [b.shape for b in bufs] == [(2, 3), (2, 3)]
    np.testing.assert_array_equal(bufs[0].ravel(), [1, 1, 1, 1, 2, 2])
    np.testing.assert_array_equal(bufs[1].ravel(), [-1, -1, -1, -1, -2, -2])


def test_the_puts_answer_says_which_slices_dropped_the_updater_buffers_put():
    req = m.Msg(m.addr(0, 0, m.kStub), S, m.kPut, m.param_trgt(4, 0), 1)
    answers = [pm.put_reply(req, 1, 1, dropped).frames for dropped in (False, True)]
    msg = wire(pm.gathered(req.src, W, m.kRPut, 11, 1, [0, 4], answers))
    assert msg.type == m.kRPut and pm.read_put_reply(msg, "param 'w'") == (1, True)
    kept = wire(pm.gathered(req.src, W, m.kRPut, 11, 1, [0], answers[:1]))
    assert pm.read_put_reply(kept, "param 'w'") == (1, False)


def test_sync_messages_round_trip():
    d = np.arange(3, dtype=np.float32)
    msg = wire(pm.sync(S, m.addr(1, 3, m.kServer), m.kSyncRequest, m.param_trgt(4, 1), 7, d))
    np.testing.assert_array_equal(pm.parse_sync(msg, 3), d)
    with pytest.raises(ClusterError):
        pm.parse_sync(wire(m.Msg(S, S, m.kSyncResponse, 0, 0)), 3)
