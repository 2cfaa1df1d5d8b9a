"""LayerChannel: bridge blobs between two workers through a stub's Router; waits that end."""
import numpy as np
import pytest
import zmq

from singa.comm import msg as m
from singa.comm.bridge import LayerChannel
from singa.comm.socket import Dealer, Router
from singa.errors import ClusterError
from singa.proto import job_pb2
from singa.train.worker import Worker


class Bridge:
    def __init__(self, name, partition_id, peer=None):
        self.name, self.partition_id, self.peer = name, partition_id, peer


class Stopped(Exception):
    pass


def stop_on_kstop(msg):
    if msg.type == m.kStop:
        raise Stopped


class Inbox:
    """A worker's inbox as its channel waits on it: the worker's one loop (`Worker.receive`),
    which hands the channel its messages and the others to `handle`."""
    receive = Worker.receive

    def __init__(self, dealer, handle, poll_ms=10):
        self.dealer, self.other, self.poll_ms = dealer, handle, poll_ms
        self.who, self.channel = "Worker (group = 0, id = 0)", None

    def handle(self, msg):
        if self.channel.is_for(msg):
            self.channel.keep(msg)
        else:
            self.other(msg)


def channel(endpoint, grp, id_, dealer, handle, timeout, where=None):
    """Worker (grp, id_)'s LayerChannel, waiting in the worker's loop over `dealer`'s inbox."""
    inbox = Inbox(dealer, handle)
    inbox.channel = LayerChannel(endpoint, grp, id_, dealer, inbox.receive, timeout, where)
    return inbox.channel


@pytest.fixture
def workers():
    """Two channels of group 0 (workers 0 and 1) and the router between them."""
    ctx = zmq.Context()
    router = Router(ctx, "inproc://test-bridge")
    params = [Dealer(m.addr(0, j, m.kWorkerParam), router.endpoint) for j in (0, 1)]
    chans = [channel(router.endpoint, 0, j, params[j], stop_on_kstop, 0.3) for j in (0, 1)]
    yield router, params, chans
    for x in params + chans:
        x.close()
    router.close()
    ctx.term()


def relay(router):
    """What a stub does with a message between workers: route it to its destination."""
    msg = router.receive(1000)
    assert m.addr_type(msg.dst) == m.kWorkerLayer
    router.send(msg)


def test_blob_goes_to_the_named_layer_of_the_peer(workers):
    router, _, (c0, c1) = workers
    src, dst = Bridge("bridge_src(a@0->b@1)", 0), Bridge("bridge_dst(a@0->b@1)", 1)
    src.peer, dst.peer = dst, src
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    c0.send(src, dst, job_pb2.kForward, x)
    relay(router)
    out = np.zeros_like(x)
    c1.receive(dst, job_pb2.kForward, out)
    np.testing.assert_array_equal(out, x)
    c1.send(dst, src, job_pb2.kBackward, -x)
    relay(router)
    c0.receive(src, job_pb2.kBackward, out)
    np.testing.assert_array_equal(out, -x)


def test_a_missing_blob_times_out_naming_the_peer_worker(workers):
    _, _, (c0, _) = workers
    src = Bridge("bridge_src(a@0->b@1)", 0, Bridge("bridge_dst(a@0->b@1)", 1))
    with pytest.raises(ClusterError, match=r"no gradient for layer 'bridge_src\(a@0->b@1\)' "
                                           r"from worker \(0, 1\)"):
        c0.receive(src, job_pb2.kBackward, np.zeros(3, np.float32))


def test_a_stop_ends_a_wait_for_a_blob(workers):
    router, _, (c0, _) = workers
    router.send(m.Msg(m.STUB, m.addr(0, 0, m.kWorkerParam), m.kStop))
    dst = Bridge("bridge_dst(a@1->b@0)", 0, Bridge("bridge_src(a@1->b@0)", 1))
    with pytest.raises(Stopped):
        c0.receive(dst, job_pb2.kForward, np.zeros(3, np.float32))
