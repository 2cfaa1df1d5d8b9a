"""Stub: the message router of a process (SINGA's src/stub.cc), run by the main thread.

It keeps a ParamEntry per (worker group, owner param): the local shares of that param, how
many shares the group has in all, and the param's slices on the servers. Workers' Put / Get /
Update go through it (local gradients are summed first); servers' RGet / RUpdate come back
through it and are passed to every local share. Everything else is forwarded by address.
"""
import logging

from singa.comm import msg as m
from singa.errors import SingaError

log = logging.getLogger("singa")


class ParamEntry:
    """The shares of one owner param inside a process, and its slices (id, server, views)."""

    def __init__(self, grp, owner, num_total, slices):
        self.grp = grp
        self.owner = owner
        self.shares = []            # (worker address, Param)
        self.num_total = num_total
        self.slices = slices        # [(slice id, server address, offset, size)]
        self.num_update = 0
        self.next_version = -1
        self.answers = {}           # version -> slice responses received
        self._views = None

    def add_share(self, worker_addr, param):
        self.shares.append((worker_addr, param))

    @property
    def num_local(self):
        return len(self.shares)

    def views(self, which):
        """Per slice, flat views of the first share's `data` or `grad` (made once)."""
        if self._views is None:
            p = self.shares[0][1]
            flat_d, flat_g = p.data.reshape(-1), p.grad.reshape(-1)
            self._views = {"data": [flat_d[o:o + n] for _, _, o, n in self.slices],
                           "grad": [flat_g[o:o + n] for _, _, o, n in self.slices]}
        return self._views[which]


class Stub:
    """Routes messages among the executors of this process until they have all stopped."""

    def __init__(self, router, address, entries, nworkers, nservers, poll_ms=100, alive=None):
        self.router = router
        self.address = address
        self.entries = entries      # {(grp, owner id): ParamEntry}
        self.nworkers = nworkers
        self.nservers = nservers
        self.poll_ms = poll_ms
        self.alive = alive          # callable: False when an executor died (stop waiting)

    def run(self):
        log.info("Stub in process starts")
        while self.nworkers > 0 or self.nservers > 0:
            msg = self.router.receive(self.poll_ms)
            if msg is None:
                if self.alive is not None and not self.alive():
                    return
                continue
            self.handle(msg)
        log.info("Stub in process stops")

    def handle(self, msg):
        t = msg.type
        if t == m.kStop:
            if m.addr_type(msg.src) == m.kServer:
                self.nservers -= 1
            else:
                self.nworkers -= 1
        elif t == m.kPut:
            self.handle_put(msg)
        elif t == m.kGet:
            self.handle_get(msg)
        elif t == m.kUpdate:
            self.handle_update(msg)
        elif t in (m.kRGet, m.kRUpdate):
            self.handle_response(msg)
        elif t == m.kConnect:
            pass
        else:
            self.router.send(msg)

    def entry(self, msg):
        key = (m.addr_grp(msg.src), m.param_id(msg.trgt_val))
        try:
            return self.entries[key]
        except KeyError:
            raise SingaError(f"stub: no param entry for group {key[0]}, param {key[1]}") from None

    def handle_put(self, msg):
        e = self.entry(msg)
        p = e.shares[0][1]
        for (sid, server, _, n), view in zip(e.slices, e.views("data")):
            frame = m.format_frame("iffpi", n, p.lr_scale, p.wd_scale, view, e.num_total)
            self.router.send(m.Msg(msg.src, server, m.kPut, m.param_trgt(e.owner, sid),
                                   msg.trgt_version, [frame]))

    def handle_get(self, msg):
        e = self.entry(msg)
        if msg.trgt_version <= e.next_version:
            return
        e.next_version = msg.trgt_version
        for sid, server, _, _ in e.slices:
            self.router.send(m.Msg(msg.src, server, m.kGet, m.param_trgt(e.owner, sid),
                                   msg.trgt_version, [m.format_frame("i", 0)]))

    def handle_update(self, msg):
        e = self.entry(msg)
        e.num_update += 1
        if e.num_update < e.num_local:
            return
        e.num_update = 0
        if e.num_local > 1:
            g = e.shares[0][1].grad
            for _, p in e.shares[1:]:
                g += p.grad
        for (sid, server, _, _), view in zip(e.slices, e.views("grad")):
            frame = m.format_frame("ipi", 0, view, e.num_local)
            self.router.send(m.Msg(e.shares[0][0], server, m.kUpdate,
                                   m.param_trgt(e.owner, sid), msg.trgt_version, [frame]))

    def handle_response(self, msg):
        """A slice answered; once every slice has, every local share learns the new version."""
        e = self.entries[(m.addr_grp(msg.dst), m.param_id(msg.trgt_val))]
        n = e.answers.get(msg.trgt_version, 0) + 1
        if n < len(e.slices):
            e.answers[msg.trgt_version] = n
            return
        e.answers.pop(msg.trgt_version, None)
        for worker, p in e.shares:
            self.router.send(m.Msg(msg.src, worker, msg.type, m.param_trgt(p.id, 0),
                                   msg.trgt_version))
