"""LayerChannel: messages among the workers of a group (SINGA's second dealer per worker, address
kWorkerLayer): bridge layers' blobs (kData) and the partitions' display metrics (kMetric).

A message is [name; frames...] with `trgt_val` saying what it carries (kForward: data,
kBackward: gradient, a step for metrics); it travels through the stubs like any other, so the
two workers may be in one process or two. Its Dealer shares the worker's inbox: while it
waits the channel hands the worker's other messages to the worker (answers from servers are
handled, a kStop ends the wait), and the worker hands it what comes for it (`keep`).
"""
import collections
import logging
import time

import numpy as np

from singa.comm import msg as m
from singa.comm.socket import Dealer
from singa.device import assign
from singa.errors import ClusterError
from singa.proto import job_pb2

log = logging.getLogger("singa")


class LayerChannel:
    """Worker (grp, id)'s connection to the other workers of its group."""

    def __init__(self, endpoint, grp, id_, param_dealer, handle, poll_ms, timeout,
                 where=None):
        """`handle(msg)`: the worker's handler of the messages for it that arrive meanwhile
        on the shared inbox of `param_dealer`; `where(peer)`: where worker (grp, peer) runs,
        "process P at host:port" (for a time-out)."""
        self.grp, self.id = grp, id_
        self.where = where
        self.address = m.addr(grp, id_, m.kWorkerLayer)
        self.dealer = Dealer(self.address, endpoint, inbox=param_dealer.inbox)
        self.param_dealer, self.handle = param_dealer, handle
        self.poll_ms, self.timeout = poll_ms, timeout
        self.boxes = collections.defaultdict(collections.deque)    # (name, trgt) -> [frames]

    def is_for(self, msg):
        """Whether `msg` is this channel's (not the worker's param dealer's)."""
        return msg.dst == self.address

    def keep(self, msg):
        """File a message for this channel until `wait` asks for it."""
        if not msg.frames:
            log.warning("Worker (group = %d, id = %d): dropped %r", self.grp, self.id, msg)
            return
        self.boxes[(bytes(msg.frames[0]).decode(errors="replace"), msg.trgt_val)].append(
            msg.frames[1:])

    def send(self, layer, peer, kind, array):
        """A bridge layer's blob (kind kForward: data, kBackward: gradient) for `peer`."""
        self.post(peer.partition_id, m.kData, peer.name, kind, [m.array_frame(array)])

    def receive(self, layer, kind, out):
        """Wait for the blob of `kind` sent to bridge `layer` and copy it into `out`."""
        what = "data" if kind == job_pb2.kForward else "gradient"
        frames = self.wait(layer.name, kind, f"{what} for layer '{layer.name}'",
                           layer.peer.partition_id)
        if len(frames) != 1:
            raise ClusterError(f"{what} for layer '{layer.name}' in {len(frames)} frames")
        assign(out.reshape(-1), m.frame_array(frames[0], out.size))

    def post(self, to, type_, name, trgt, frames):
        self.dealer.send(m.Msg(self.address, m.addr(self.grp, to, m.kWorkerLayer), type_, trgt,
                               0, [name.encode()] + list(frames)))

    def wait(self, name, trgt, what, peer):
        """The frames of the next message [name; frames] with `trgt`, from worker `peer`;
        ClusterError naming the peer after `timeout` seconds without it."""
        box = self.boxes[(name, trgt)]
        deadline = time.monotonic() + self.timeout
        while not box:
            msg = self.param_dealer.receive(self.poll_ms)
            if msg is not None and self.is_for(msg):
                self.keep(msg)
            elif msg is not None:
                try:
                    self.handle(msg)
                except ClusterError as e:   # bad traffic: dropped
                    log.warning("Worker (group = %d, id = %d): dropped %r: %s",
                                self.grp, self.id, msg, e)
            if not box and time.monotonic() > deadline:
                at = f" ({self.where(peer)})" if self.where is not None else ""
                raise ClusterError(f"worker ({self.grp}, {self.id}): no {what} from worker "
                                   f"({self.grp}, {peer}){at} in {self.timeout:.0f} s")
        return box.popleft()

    def close(self):
        self.dealer.close()
