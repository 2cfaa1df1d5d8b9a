"""Server-group sync (Distributed Hogwild): a server of group 1 and the master of the slice in
group 0, driven message by message over a real inproc Router standing for the stub."""
import threading

import numpy as np
import pytest
import zmq
from google.protobuf import text_format

from singa.comm import msg as m
from singa.comm import param_msg as pm
from singa.comm.socket import Router
from singa.errors import ClusterError
from singa.proto import job_pb2
from singa.train.server import Server

UPDATER = "type: kSGD learning_rate { type: kFixed base_lr: 0.5 }"
MASTER, OTHER = m.addr(0, 0, m.kServer), m.addr(1, 0, m.kServer)
WORKER = m.addr(1, 0, m.kWorkerParam)


@pytest.fixture
def servers():
    ctx = zmq.Context()
    router = Router(ctx, f"inproc://test-server-sync-{id(ctx)}")
    updater = text_format.Parse(UPDATER, job_pb2.UpdaterProto())
    made = []
    try:    # closed whatever happens, or ctx.term() would wait for them at exit
        made += [Server(router.endpoint, g, 0, updater, masters={0: MASTER}, sync_freq=2)
                 for g in (0, 1)]
        yield router, made
    finally:
        for s in made:
            s.dealer.close()
        router.close()
        ctx.term()


def put(server, values):
    frames = [m.format_frame("iffii", values.size, 1, 1, 1, -1), m.array_frame(values.copy())]
    server.handle(m.Msg(WORKER, server.address, m.kPut, m.param_trgt(0, 0), 0, frames))


def update(server, grad):
    server.handle(pm.slice_update(WORKER, server.address, 0, [(0, 0, 1, grad.copy())]))


def sent(router, type_):
    """The next message the servers sent of `type_` (acknowledgements skipped)."""
    while True:
        msg = router.receive(2000)
        assert msg is not None, f"no message of type {type_}"
        if msg.type == type_:
            return msg


def deliver(router, server, type_):
    msg = sent(router, type_)
    assert msg.dst == server.address
    server.handle(msg)
    return msg


def test_sync_sends_the_delta_to_the_master_and_keeps_later_updates(servers):
    router, (master, other) = servers
    w0 = np.array([1.0, 2.0, 3.0], np.float32)
    put(master, w0)
    put(other, w0)
    update(master, np.array([2.0, 0.0, -2.0], np.float32))   # the master's own group: w0 - 0.5 g
    update(other, np.array([1.0, 1.0, 1.0], np.float32))
    update(other, np.array([1.0, 3.0, 5.0], np.float32))     # sync_freq 2: a sync request now
    request = deliver(router, master, m.kSyncRequest)
    delta = -0.5 * np.array([2.0, 4.0, 6.0], np.float32)    # both updates of group 1
    np.testing.assert_allclose(m.frame_array(request.frames[0], 3), delta)
    master_now = w0 - 0.5 * np.array([2.0, 0.0, -2.0], np.float32) + delta
    np.testing.assert_allclose(master.slices[0].data, master_now)
    # an update of group 1 lands before the master's answer: it survives the sync
    update(other, np.array([2.0, 2.0, 2.0], np.float32))
    response = deliver(router, other, m.kSyncResponse)
    np.testing.assert_allclose(m.frame_array(response.frames[0], 3), master_now)
    expected = master_now - 0.5 * np.array([2.0, 2.0, 2.0], np.float32)  # master + (cur - last)
    np.testing.assert_allclose(other.slices[0].data, expected, rtol=1e-6)
    np.testing.assert_allclose(other.slices[0].last_sync, expected, rtol=1e-6)
    assert (other.syncs_received, other.syncs_answered) == (1, 0)
    assert (master.syncs_received, master.syncs_answered) == (0, 1)


def test_master_slices_are_not_synced_and_stray_sync_messages_change_nothing(servers):
    router, (master, other) = servers
    w0 = np.zeros(3, np.float32)
    put(master, w0)
    put(other, w0)
    for _ in range(4):
        update(master, np.ones(3, np.float32))
    while (msg := router.receive(50)) is not None:
        assert msg.type == m.kRUpdate or msg.type == m.kRPut     # never a sync of its own slice
    stray = m.Msg(MASTER, OTHER, m.kSyncResponse, m.param_trgt(0, 0), 0,
                  [m.array_frame(np.ones(3, np.float32))])
    with pytest.raises(ClusterError, match="unexpected sync response"):
        other.handle(stray)                                       # none pending
    with pytest.raises(ClusterError, match="does not master"):
        other.handle(m.Msg(MASTER, OTHER, m.kSyncRequest, m.param_trgt(0, 0), 0,
                           [m.array_frame(np.ones(3, np.float32))]))
    np.testing.assert_array_equal(other.slices[0].data, 0)


def test_a_sync_request_before_the_masters_put_waits_for_it(servers):
    router, (master, other) = servers
    w0 = np.ones(2, np.float32)
    put(other, w0)
    for _ in range(2):
        update(other, np.ones(2, np.float32))
    deliver(router, master, m.kSyncRequest)                  # the master has no slice yet
    put(master, w0)
    response = deliver(router, other, m.kSyncResponse)
    np.testing.assert_allclose(m.frame_array(response.frames[0], 2), w0 - 1.0)
    np.testing.assert_allclose(other.slices[0].data, w0 - 1.0)


@pytest.mark.parametrize("copy_replies", [False, True])
def test_replies_of_asynchronous_groups_are_copies_later_updates_cannot_change(copy_replies):
    """An RUpdate on its way to another process must keep the values it was sent with, though
    another group's update changes the slice meanwhile (copy_replies); in-process answers
    alias the slice (no copy_replies)."""
    ctx = zmq.Context()
    router = Router(ctx, f"inproc://test-server-replies-{id(ctx)}")
    updater = text_format.Parse(UPDATER, job_pb2.UpdaterProto())
    server = Server(router.endpoint, 0, 0, updater, copy_replies=copy_replies)
    n = 1 << 15     # above pyzmq's copy threshold: frames are sent zero-copy
    try:
        put(server, np.ones(n, np.float32))
        update(server, np.ones(n, np.float32))
        reply = sent(router, m.kRUpdate)
        update(server, np.ones(n, np.float32))      # the next group's update
        [(_, _, [frame])] = pm.parse_updated(reply)
        values = m.frame_array(frame, n)
        np.testing.assert_array_equal(values, 0.5 if copy_replies else 0.0)
    finally:
        server.dealer.close()
        router.close()
        ctx.term()


def test_a_restarted_workers_join_counts_it_in_and_its_old_farewell_arriving_late_not_out():
    """Farewells (kStop) and joins (kConnect) carry the incarnation of the worker's process: a
    restart's join takes back the farewell of the process it restarts, and that farewell
    arriving again after the join (late, over the old process's connection) changes nothing;
    the group ends once every worker's newest incarnation has left."""
    ctx = zmq.Context()
    router = Router(ctx, f"inproc://test-server-farewells-{id(ctx)}")
    updater = text_format.Parse(UPDATER, job_pb2.UpdaterProto())
    server = Server(router.endpoint, 0, 0, updater, poll_ms=10, nworkers=2)
    stays, restarted = m.addr(0, 0, m.kWorkerParam), m.addr(0, 1, m.kWorkerParam)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for src, type_, incarnation in [(restarted, m.kStop, 5), (restarted, m.kConnect, 9),
                                        (restarted, m.kStop, 5), (restarted, m.kConnect, 5),
                                        (stays, m.kStop, 3)]:
            router.send(m.Msg(src, server.address, type_, 0, incarnation))
        assert router.receive(300) is None and server.left == {stays}
        router.send(m.Msg(restarted, server.address, m.kStop, 0, 9))
        assert router.receive(2000).type == m.kStop      # to the stub: every worker has left
    finally:
        router.send(m.Msg(m.STUB, server.address, m.kStop))
        thread.join(5)
        server.dealer.close()
        router.close()
        ctx.term()
    assert not thread.is_alive()
