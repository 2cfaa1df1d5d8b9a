"""Server: owns param slices and applies its own Updater to them (SINGA's src/server.cc).

Messages come from stubs and are answered to the requesting stub; their frames are
`comm.param_msg`'s. A Put creates the slice (in-process values alias the putting worker's
array, on its GPU if it has one: the slice is then updated there, and values from another
process are copied to it); a Get is answered once the slice reaches the version asked for; an
Update brings gradients of several slices, and each slice waits for `num_total` shares, sums
them in the order of their senders' addresses (deterministic) and applies the updater with
grad_scale = 1/num_total, the gradient frame handed over as scratch (one kRUpdate per stub
answers the slices an Update completed);
a State request returns the LR index and copies of the updater buffers (for a snapshot); a
slice mastered by another server group syncs with it (Distributed Hogwild: `sync`). kStop from
the stub ends the loop; from a worker (its farewell, in a job of several processes) it counts
the worker out, and the loop ends once every worker of the group has left. A worker's kConnect
(its join) counts it in again: both carry the incarnation of the worker's process (a restart's
is larger), so a late farewell of a process that has been restarted since, arriving over
another connection than its restart's join, changes nothing (`count`). A malformed message
is dropped with a log line; a failure goes to the stub as kError.
"""
import logging

import numpy as np

from singa.comm import msg as m
from singa.comm import param_msg as pm
from singa.comm.socket import Dealer
from singa.device import host, host_copy, is_host, like, module, on
from singa.errors import ClusterError, executor_failure
from singa.train.updater import create_updater

log = logging.getLogger("singa")


class Slice:
    __slots__ = ("data", "lr_scale", "wd_scale", "num_total", "version", "buffers", "pending",
                 "num_shares", "grads", "last_sync", "n_updates", "n_pending_sync")

    def __init__(self, data, lr_scale, wd_scale, num_total, version, buffers):
        self.data, self.lr_scale, self.wd_scale = data, lr_scale, wd_scale
        self.num_total, self.version, self.buffers = num_total, version, buffers
        self.pending = []       # the stubs whose Updates wait for the other shares
        self.num_shares = 0
        self.grads = m.OrderedSum(data.size)     # their gradients
        self.last_sync = None   # the values at the last sync (a slice mastered elsewhere)
        self.n_updates = 0      # updates since the last sync request
        self.n_pending_sync = 0


class Server:
    """One server thread of server group `grp`, id `id`, with its own Updater."""

    def __init__(self, endpoint, grp, id_, updater_proto, poll_ms=100, nworkers=None,
                 masters=None, sync_freq=1, copy_replies=False):
        """`nworkers`: the workers whose farewells end the server (None: only the stub's kStop);
        `masters`: {slice id: address of its master server} when there are several server
        groups, which sync every `sync_freq` updates of a slice (SINGA's src/server.cc).
        `copy_replies`: answer with a copy of the values, not a view of them, where another
        group's update may change them while a reply is still on its way to another process
        (asynchronous groups across processes)."""
        self.grp, self.id = grp, id_
        self.masters, self.sync_freq = masters or {}, sync_freq
        self.early_syncs = []   # sync requests for a slice of ours not put yet
        self.syncs_received = 0     # sync responses from master servers
        self.syncs_answered = 0     # sync requests answered as a master
        self.nworkers, self.left = nworkers, set()
        self.counted = {}       # worker -> (incarnation, left) of its newest join or farewell
        self.copy_replies = copy_replies
        self.address = m.addr(grp, id_, m.kServer)
        self.dealer = Dealer(self.address, endpoint)
        self.updater = create_updater(updater_proto)
        self.poll_ms = poll_ms
        self.slices = {}
        self.waiting_gets = []

    def run(self):
        log.info("Server (group = %d, id = %d) start", self.grp, self.id)
        try:
            while True:
                msg = self.dealer.receive(self.poll_ms)
                if msg is None:
                    continue
                if msg.type == m.kStop and m.addr_type(msg.src) != m.kWorkerParam:
                    break
                if msg.type in (m.kStop, m.kConnect) and \
                        m.addr_type(msg.src) == m.kWorkerParam:
                    self.count(msg)
                    if self.nworkers is not None and len(self.left) >= self.nworkers:
                        log.info("Server (group = %d, id = %d): every worker has left",
                                 self.grp, self.id)
                        break
                    continue
                try:
                    self.handle(msg)
                except ClusterError as e:   # bad traffic: no state was changed
                    log.warning("Server (group = %d, id = %d): dropped %r: %s",
                                self.grp, self.id, msg, e)
        except Exception as e:  # the stub stops the job and reports it
            kind, text = executor_failure(e, f"Server (group = {self.grp}, id = {self.id})")
            self.dealer.send(m.Msg(self.address, m.STUB, m.kError,
                                   frames=m.error_frames(kind, text)))
        finally:
            if self.masters:
                log.info("Server (group = %d, id = %d): %d syncs with master servers, %d as "
                         "master", self.grp, self.id, self.syncs_received, self.syncs_answered)
            self.dealer.send(m.Msg(self.address, m.STUB, m.kStop))
            log.info("Server (group = %d, id = %d) stops", self.grp, self.id)

    def count(self, msg):
        """A worker's farewell (kStop) or join (kConnect) of its process's incarnation
        `trgt_version`: it leaves or is in again, unless this is older news than the newest
        counted (an earlier incarnation's, or a join after its own farewell)."""
        news = (msg.trgt_version, msg.type == m.kStop)
        if news <= self.counted.get(msg.src, (-1, False)):
            log.info("Server (group = %d, id = %d): a late %s of worker (%d, %d) of an earlier "
                     "incarnation of its process changes nothing", self.grp, self.id,
                     "farewell" if news[1] else "join", m.addr_grp(msg.src), m.addr_id(msg.src))
            return
        self.counted[msg.src] = news
        if news[1]:
            self.left.add(msg.src)
        else:
            self.left.discard(msg.src)

    def handle(self, msg):
        t = msg.type
        if t == m.kUpdate:
            self.handle_update(msg)
            return
        sid = m.slice_id(msg.trgt_val)
        if t == m.kPut:
            self.handle_put(sid, msg)
        elif t == m.kGet:
            self.waiting_gets.append(msg)
            self.answer_gets()
        elif t == m.kSyncRequest:
            self.handle_sync_request(sid, msg)
        elif t == m.kSyncResponse:
            self.handle_sync_response(sid, msg)
        elif t == m.kState:
            s = self.slice(sid)
            self.dealer.send(pm.state_reply(msg, s.version, self.updater.lr_gen.get_index(),
                                            s.buffers))
        else:
            raise ClusterError(f"unexpected message type {t}")

    def slice(self, sid):
        try:
            return self.slices[sid]
        except KeyError:
            raise ClusterError(f"no slice {sid} on this server") from None

    def handle_put(self, sid, msg):
        """Creates the slice; updater buffers other than the updater keeps (a snapshot of
        another updater) are dropped: its state starts afresh, and the kRPut says so (the
        worker, which knows the param's name and snapshot file, warns)."""
        lr_scale, wd_scale, num_total, lr_index, values, buffers = pm.parse_slice_put(msg)
        data = own(values)
        nstate = self.updater.nstate
        dropped = bool(buffers) and len(buffers) != nstate
        with on(data):
            kept = [like(data, b.copy()) for b in buffers] if buffers and not dropped \
                else self.updater.new_state(data.size, module(data))
            last_sync = data.copy() if self.masters.get(sid, self.address) != self.address \
                else None
        if lr_index >= 0:
            self.updater.lr_gen.set_index(lr_index)
        s = self.slices[sid] = Slice(data, lr_scale, wd_scale, num_total, msg.trgt_version, kept)
        s.last_sync = last_sync
        self.dealer.send(pm.put_reply(msg, msg.trgt_version, nstate, dropped))
        self.answer_gets()
        early, self.early_syncs = self.early_syncs, []
        for req in early:
            self.handle_sync_request(m.slice_id(req.trgt_val), req)

    def answer_gets(self):
        still = []
        for msg in self.waiting_gets:
            s = self.slices.get(m.slice_id(msg.trgt_val))
            if s is None or s.version < msg.trgt_version:
                still.append(msg)
            else:
                self.dealer.send(pm.values_reply(msg, s.version, self.reply_values(s)))
        self.waiting_gets = still

    def reply_values(self, s):
        """Slice `s`'s values for a reply: a copy where they may change before it is read."""
        return host_copy(s.data) if self.copy_replies else s.data

    def handle_update(self, msg):
        """A stub's gradients of slices: each slice is updated once its `num_total` shares
        have come, and the stubs that sent them get its values, one kRUpdate per stub and
        version."""
        checked, sids = [], set()
        for owner, sid, num_local, frame in pm.parse_slice_update(msg):   # all before any
            s = self.slice(sid)
            grad = m.frame_array(frame, s.data.size)
            if not 1 <= num_local <= s.num_total - s.num_shares or sid in sids:
                raise ClusterError(f"malformed Update of slice {sid}")
            sids.add(sid)
            checked.append((owner, sid, s, num_local, grad))
        done = []       # the slices whose shares have all come: (owner, slice id, slice, sum)
        for owner, sid, s, num_local, grad in checked:
            s.pending.append(msg.src)
            s.grads.add(msg.src, like(s.data, own(grad)))
            s.num_shares += num_local
            if s.num_shares == s.num_total:
                done.append((owner, sid, s, s.grads.take()))
        if not done:
            return
        self.updater.update_many(msg.trgt_version, [
            (s.data, g, s.buffers, s.lr_scale, s.wd_scale, 1.0 / s.num_total)
            for _, _, s, g in done])
        replies = {}    # (stub, version) -> [(owner, slice id, values)]
        for owner, sid, s, _ in done:
            s.version += 1
            for stub in s.pending:
                replies.setdefault((stub, s.version), []).append(
                    (owner, sid, self.reply_values(s)))
            s.pending = []
            s.num_shares = 0
            if s.last_sync is not None:
                self.sync(sid, s, m.param_trgt(owner, sid))
        for (stub, version), items in replies.items():
            self.dealer.send(pm.updated(self.address, stub, version, items))
        if self.waiting_gets:
            self.answer_gets()

    def sync(self, sid, s, trgt_val):
        """After `sync_freq` updates of a slice mastered elsewhere (and not too many syncs
        pending): kSyncRequest [cur - last_sync] to its master; last_sync = cur."""
        s.n_updates += 1
        if s.n_updates < self.sync_freq or s.n_pending_sync > self.sync_freq:
            return
        with on(s.data):
            delta = host(np.subtract(s.data, s.last_sync))     # the message's own buffer
            s.last_sync[...] = s.data
        s.n_updates = 0
        s.n_pending_sync += 1
        self.dealer.send(pm.sync(self.address, self.masters[sid], m.kSyncRequest, trgt_val,
                                 s.version, delta))

    def handle_sync_request(self, sid, msg):
        """On the master: cur += delta; kSyncResponse [a copy of cur]."""
        if self.masters.get(sid) != self.address:
            raise ClusterError(f"sync request for slice {sid}, which this server does not master")
        if sid not in self.slices:
            self.early_syncs.append(msg)
            return
        s = self.slices[sid]
        with on(s.data):
            s.data += like(s.data, pm.parse_sync(msg, s.data.size))
        self.syncs_answered += 1
        self.dealer.send(pm.sync(self.address, msg.src, m.kSyncResponse, msg.trgt_val, s.version,
                                 host_copy(s.data)))

    def handle_sync_response(self, sid, msg):
        """On the requester: cur = master + (cur - last_sync); last_sync = cur."""
        s = self.slice(sid)
        if s.last_sync is None or s.n_pending_sync < 1 or msg.src != self.masters[sid]:
            raise ClusterError(f"unexpected sync response for slice {sid}")
        with on(s.data):
            master = like(s.data, pm.parse_sync(msg, s.data.size))
            s.data += np.subtract(master, s.last_sync, out=s.last_sync)
            s.last_sync[...] = s.data
        s.n_pending_sync -= 1
        self.syncs_received += 1


def own(a):
    """`a` itself when writable (a frame's buffer, or a GPU array handed over, is then ours
    to use), else a copy."""
    return a if not is_host(a) or a.flags.writeable else a.copy()
