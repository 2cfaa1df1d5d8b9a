"""Server: owns param slices and applies the Updater to them (SINGA's src/server.cc).

A slice is created by a Put (values by reference inside a process), answers a Get once its
version has reached the requested one, and applies one update per `num_total` gradient shares
(averaged with grad_scale = 1/num_total), then answers every buffered request with RUpdate.
The server stops when its server group has no more workers (a ZooKeeper watch).
"""
import logging
import threading

from singa.comm import msg as m
from singa.comm.socket import Dealer

log = logging.getLogger("singa")


class Slice:
    __slots__ = ("data", "lr_scale", "wd_scale", "num_total", "version", "state", "pending",
                 "num_shares", "name")

    def __init__(self, data, lr_scale, wd_scale, num_total, version, state):
        self.data, self.lr_scale, self.wd_scale = data, lr_scale, wd_scale
        self.num_total, self.version, self.state = num_total, version, state
        self.pending = []       # update requests waiting for the other shares
        self.num_shares = 0
        self.name = ""


class Server:
    """One server thread: `grp`, `id`, an Updater; `restore` gives updater buffers by slice id."""

    def __init__(self, ctx, endpoint, grp, id_, updater, poll_ms=100, restore=None):
        self.grp, self.id = grp, id_
        self.address = m.addr(grp, id_, m.kServer)
        self.dealer = Dealer(ctx, self.address, endpoint)
        self.updater = updater
        self.poll_ms = poll_ms
        self.slices = {}
        self.waiting_gets = []
        self.restore = restore or {}
        self.stopping = threading.Event()
        self.error = None

    def stop(self):
        """Called when the server group has no workers left (ZooKeeper watch)."""
        self.stopping.set()

    def run(self):
        log.info("Server (group = %d, id = %d) start", self.grp, self.id)
        try:
            while True:
                msg = self.dealer.receive(self.poll_ms)
                if msg is None:
                    if self.stopping.is_set():
                        break
                    continue
                self.handle(msg)
        except Exception as e:  # reported by the driver, which then stops the job
            self.error = e
            log.exception("server failed")
        finally:
            self.dealer.send(m.Msg(self.address, m.addr(-1, -1, m.kStub), m.kStop))
            log.info("Server (group = %d, id = %d) stops", self.grp, self.id)

    def handle(self, msg):
        t = msg.type
        sid = m.slice_id(msg.trgt_val)
        if t == m.kPut:
            n, lr_scale, wd_scale, data, num_total = m.parse_format_frame("iffpi", msg.frames[0])
            state = self.restore.get(sid) or self.updater.new_state(data.shape)
            self.slices[sid] = Slice(data, lr_scale, wd_scale, num_total, msg.trgt_version, state)
            self.answer_gets()
        elif t == m.kGet:
            self.waiting_gets.append(msg)
            self.answer_gets()
        elif t == m.kUpdate:
            self.handle_update(sid, msg)

    def answer_gets(self):
        still = []
        for msg in self.waiting_gets:
            s = self.slices.get(m.slice_id(msg.trgt_val))
            if s is None or s.version < msg.trgt_version:
                still.append(msg)
            else:
                self.dealer.send(msg.reply(m.kRGet, s.version))
        self.waiting_gets = still

    def handle_update(self, sid, msg):
        s = self.slices[sid]
        _, grad, num_local = m.parse_format_frame("ipi", msg.frames[0])
        s.pending.append((msg, grad))
        s.num_shares += num_local
        if s.num_shares < s.num_total:
            return
        g = s.pending[0][1]
        for _, other in s.pending[1:]:
            g += other
        self.updater.update(msg.trgt_version, s.data, g, s.state,
                            s.lr_scale, s.wd_scale, 1.0 / s.num_total)
        s.version += 1
        for req, _ in s.pending:
            self.dealer.send(req.reply(m.kRUpdate, s.version))
        s.pending = []
        s.num_shares = 0
        if self.waiting_gets:
            self.answer_gets()
