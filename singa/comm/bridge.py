"""LayerChannel: messages among the workers of a group (SINGA's second dealer per worker, address
kWorkerLayer): bridge layers' blobs (kData) and the partitions' display metrics (kMetric).

A message is [name; frames...] with `trgt_val` saying what it carries (kForward: data,
kBackward: gradient, a step for metrics); it travels through the stubs like any other, so the
two workers may be in one process or two. Its Dealer shares the worker's inbox: it waits in
the worker's own loop over that inbox (`Worker.receive`: answers from servers are handled, a
kStop ends the wait), and the worker hands it what comes for it (`keep`).
"""
import collections
import logging

from singa.comm import msg as m
from singa.comm.socket import Dealer
from singa.device import assign
from singa.errors import ClusterError
from singa.proto import job_pb2
from singa.watch.metrics import partition_mean

log = logging.getLogger("singa")


class LayerChannel:
    """Worker (grp, id)'s connection to the other workers of its group."""

    def __init__(self, endpoint, grp, id_, param_dealer, receive, timeout, where=None):
        """`receive(done, timeout, late)`: the worker's loop over the inbox it shares with
        `param_dealer`, which hands this channel its messages, until `done()` or
        ClusterError(`late()`) after `timeout` s; `where(peer)`: where worker (grp, peer)
        runs, "process P at host:port" (for a time-out)."""
        self.grp, self.id = grp, id_
        self.where = where
        self.address = m.addr(grp, id_, m.kWorkerLayer)
        self.dealer = Dealer(self.address, endpoint, inbox=param_dealer.inbox)
        self.loop, self.timeout = receive, timeout
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

    def share_metrics(self, rows, key, nworkers, back):
        """The group's display metrics, `key` the display's number: worker j > 0 sends its
        `rows` ({name: value} per layer) to worker 0 and returns the averages worker 0 sends
        back when `back` (else []); worker 0 returns each metric averaged over the partitions
        of the `nworkers` (`metrics.partition_mean`) and, when `back`, sends them to the
        others."""
        if self.id > 0:
            self.post(0, m.kMetric, f"metrics@{self.id}", key, m.metric_frames(rows))
            if not back:
                return []
            return m.frame_metrics(self.wait("metrics@0", key, "averaged metrics", 0))
        every = [rows]
        for j in range(1, nworkers):
            every.append(m.frame_metrics(self.wait(f"metrics@{j}", key, "display metrics", j)))
            if [list(v) for v in every[-1]] != [list(v) for v in rows]:
                raise ClusterError(f"worker ({self.grp}, {j}) displays other metrics than "
                                   f"worker ({self.grp}, 0)")
        rows = partition_mean(every)
        if back:
            for j in range(1, nworkers):
                self.post(j, m.kMetric, "metrics@0", key, m.metric_frames(rows))
        return rows

    def post(self, to, type_, name, trgt, frames):
        self.dealer.send(m.Msg(self.address, m.addr(self.grp, to, m.kWorkerLayer), type_, trgt,
                               0, [name.encode()] + list(frames)))

    def wait(self, name, trgt, what, peer):
        """The frames of the next message [name; frames] with `trgt`, from worker `peer`;
        ClusterError naming the peer after `timeout` seconds without it."""
        box = self.boxes[(name, trgt)]
        if not box:
            self.loop(lambda: bool(box), self.timeout, lambda: self.late(what, peer))
        return box.popleft()

    def late(self, what, peer):
        at = f" ({self.where(peer)})" if self.where is not None else ""
        return (f"worker ({self.grp}, {self.id}): no {what} from worker ({self.grp}, {peer}){at} "
                f"in {self.timeout:.0f} s")

    def close(self):
        self.dealer.close()
