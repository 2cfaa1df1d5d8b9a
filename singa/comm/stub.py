"""Stub: the message router of a process (SINGA's src/stub.cc), run by the main thread.

It keeps a ParamEntry per (worker group, owner param): the local shares of that param (worker
address, param id), how many shares the group has in all, and the param's slices on the
servers. Workers' Put / Get / Update / State requests go through it (the gradients of local
shares are summed first, in the order of their addresses) to the servers, sent as the stub
itself (`address(grp)`, SINGA's Addr(grp, procs_id, kStub)); the servers answer that address
and, once every slice has answered, the stub gives each share the answer (`comm.param_msg`).
A worker's Update carries a bucket of params; the stub sends the slices it completes one
message per server, and the answers that complete params one message per worker.
Everything is routed by its destination address: an executor's here or at its process's stub
over tcp (`peers`), another stub's by the process id in it. A failure (kError) stops every
local executor; `run` then returns it as (type name, message). A process on its way out tells
every other stub (`farewell`: a kStop from stub to stub, with its proc-done mark), so that its
dropped connection is known for an end, not a loss, without ZooKeeper.
"""
import logging
import math
import queue
import threading
import time

from singa.comm import msg as m
from singa.comm import param_msg as pm
from singa.errors import ClusterError
from singa.log import RAISED

log = logging.getLogger("singa")

#: a snapshot on signal is taken some 0.25 s of steps (at least 3) after the newest step seen,
#: so that every worker of the job hears of it before it gets there
SNAPSHOT_LEAD_SECONDS, SNAPSHOT_MIN_LEAD = 0.25, 3


class ParamEntry:
    """One owner param of a worker group in this process: its local shares and its slices."""

    def __init__(self, grp, owner, slices):
        self.grp = grp
        self.owner = owner
        self.shares = []            # (worker address, param id)
        self.num_total = 0          # shares in the whole group
        self.slices = slices        # [(slice id, server address, offset, size)]
        self.index = {sid: i for i, (sid, _, _, _) in enumerate(slices)}
        self.offsets = tuple(o for _, _, o, _ in slices)
        self.size = sum(n for _, _, _, n in slices)
        self.grads = None           # the OrderedSum of the current step's gradients
        self.next_version = -1
        self.answers = {}           # message type -> {slice index: (version, frames)}
        self.state_requests = []    # the workers waiting for the updater state

    def add_share(self, worker_addr, param_id):
        self.shares.append((worker_addr, param_id))

    @property
    def num_local(self):
        return len(self.shares)


class Stub:
    """Routes messages among the executors of this process until they have all stopped."""

    def __init__(self, router, entries, executors, poll_ms=100, pid=0, locate=None, peers=None,
                 stop_servers_with_workers=True, farewells=None, nprocs=1, elastic=(),
                 forget=None, returned=None, rejoin_timeout=60.0, rejoinable=None):
        """`locate(address)` is the process of an executor (None: all are here); `peers(pid)`
        the Peer connection to another process's stub (of `nprocs`); `farewells` maps a local
        worker to the servers told (kStop from it) when it stops. The loss of a process of
        `elastic` (`cluster.elastic_procs`) does not stop this one: it is away until a message
        of its restart arrives, for at most `rejoin_timeout` s; `forget(pid)` drops its
        connection, `returned(pid)` says whether it registered again (not a late message of
        the lost one); while `rejoinable()` is false (ZooKeeper away) a loss stops this one."""
        self.nprocs = nprocs
        self.elastic, self.forget, self.returned = set(elastic), forget, returned
        self.rejoin_timeout = rejoin_timeout
        self.rejoinable = rejoinable or (lambda: True)
        self.away = {}              # procs id -> (why it left, deadline to come back)
        self.latest = 0             # the newest step an Update passing here was of
        self.latest_at = None       # when it was seen
        self.step_seconds = None    # a running mean of the time a step takes
        self.snapshot_at = None     # the step every worker stops at after a snapshot
        self.farewells = farewells or {}
        self.router = router
        self.pid, self.locate, self.peers = pid, locate, peers
        self.stop_servers_with_workers = stop_servers_with_workers
        self.entries = entries      # {(grp, owner id): ParamEntry}
        self.executors = set(executors)     # addresses of the local executors still running
        self.workers = sum(m.addr_type(a) != m.kServer for a in self.executors)
        self.servers = len(self.executors) - self.workers
        self.poll_ms = poll_ms
        self.requests = queue.SimpleQueue()     # (what, arg[, procs id]) from other threads
        self.error = None
        self.heard = time.monotonic()           # when the last message arrived
        self.ended = {}             # procs id -> its proc-done mark, from its farewell
        self.lost = set()           # the procs ids reported lost
        self.lock = threading.Lock()

    def stop(self):
        """Have `run` stop every local executor. Thread-safe, and safe in a signal handler."""
        self.requests.put(("stop", None))

    def stop_servers(self):
        """Have `run` stop the local servers (their server groups have lost every worker).
        Thread-safe."""
        self.requests.put(("servers", None))

    def request_snapshot(self, step=None):
        """Have every worker of the job stop after a snapshot, a step or two from now (or at
        `step`, if no worker has passed it yet): the step goes to this process's workers and
        the other processes' stubs. Thread-safe, and safe in a signal handler."""
        self.requests.put(("snapshot", step))

    def report_lost(self, text, procs_id=None):
        """Process `procs_id` of the job was lost (`text` says which; None: unknown or
        several): `run` stops every local executor and returns it as the failure, unless the
        process is elastic (it is then away). Once per loss of a process, whoever notices it
        (ZooKeeper or its connection); returns whether this was the first report.
        Thread-safe."""
        with self.lock:
            if procs_id in self.lost:
                return False
            if procs_id is not None:
                self.lost.add(procs_id)
        self.requests.put(("lost", text, procs_id))
        return True

    def report_back(self, procs_id):
        """Process `procs_id` registered again (a restart). Thread-safe."""
        self.requests.put(("back", procs_id))

    def farewell(self, mark):
        """Tell every other process's stub (but those away) that this one ends, with its
        proc-done `mark` (`cluster_rt.ClusterRuntime.proc_done`: "" for a normal end). After
        `run`, before the Peers close (they linger to deliver it)."""
        for pid in range(self.nprocs):
            if pid != self.pid and pid not in self.away:
                self.peers(pid).send(m.Msg(self.address(0), m.addr(0, pid, m.kStub), m.kStop,
                                           frames=[mark.encode()]), wait=False)

    def run(self):
        """Route until every local executor has stopped; the first failure, or None."""
        log.info("Stub in process starts")
        while self.workers > 0 or self.servers > 0:
            try:
                msg = self.router.receive(self.poll_ms)
                if msg is not None:
                    self.heard = time.monotonic()
                    self.handle(msg)
            except ClusterError as e:   # bad traffic: dropped, nothing changed
                log.warning("Stub: dropped a message: %s", e)
            while not self.requests.empty():
                self.take_request(*self.requests.get())
            if self.away:
                self.check_away()
            if self.stop_servers_with_workers and self.workers == 0 and self.servers > 0:
                self.stop_local(m.kServer)
        log.info("Stub in process stops")
        return self.error

    def silent_for(self):
        """Seconds since the last message arrived (for any executor here, or this stub)."""
        return time.monotonic() - self.heard

    def take_request(self, what, arg, procs_id=None):
        """Carry out a request of `stop`, `stop_servers`, `snapshot` (at step `arg`),
        `report_lost` (the failure's text `arg`, of process `procs_id`) or `report_back`
        (procs id `arg`)."""
        if what == "servers":
            self.stop_local(m.kServer)
            return
        if what == "snapshot":
            self.spread_snapshot(self.latest + self.lead() if arg is None
                                 else max(arg, self.latest + 1))
            return
        if what == "back":
            self.come_back(arg)
            return
        if what == "lost":
            text = arg
            if procs_id in self.away:
                return
            if procs_id in self.elastic and self.error is None and self.rejoinable():
                self.leave(procs_id, text)
                return
            if self.error is None:
                self.error = ("ClusterError", text)
                log.error("%s; stopping", text)
        self.stop_local(None)

    def leave(self, procs_id, text):
        """Elastic process `procs_id` is lost: its worker groups leave, this process goes on
        and drops what is sent to it until it comes back."""
        self.away[procs_id] = (text, time.monotonic() + self.rejoin_timeout)
        if self.forget is not None:
            self.forget(procs_id)
        log.warning("%s: its worker groups leave at step %d; the job goes on, and they join "
                    "again when it restarts (within %.0f s)", text, self.latest,
                    self.rejoin_timeout)

    def come_back(self, procs_id):
        """Process `procs_id` restarted: messages to it go to its new endpoint, and its next
        loss is news."""
        if self.away.pop(procs_id, None) is None:
            return
        with self.lock:
            self.lost.discard(procs_id)
        self.ended.pop(procs_id, None)
        log.info("Process %d rejoined the job at step %d: its worker groups take the servers' "
                 "params", procs_id, self.latest)

    def check_away(self):
        """A process away for longer than `rejoin_timeout`: the job stops."""
        now = time.monotonic()
        for procs_id, (text, deadline) in list(self.away.items()):
            if now > deadline and self.error is None:
                self.error = ("ClusterError", f"{text}, and did not rejoin within "
                                              f"{self.rejoin_timeout:.0f} s")
                log.error("%s; stopping", self.error[1])
                self.stop_local(None)

    def send(self, msg):
        """To a local executor through the router, else to its process's stub."""
        where = self.pid if self.locate is None else self.locate(msg.dst)
        if where == self.pid:
            self.router.send(msg)
        elif where not in self.away:
            self.peers(where).send(msg)

    def address(self, grp):
        """This stub's address for worker group `grp` (SINGA's Addr(grp, procs_id, kStub)):
        where the servers answer its requests."""
        return m.addr(grp, self.pid, m.kStub)

    def handle(self, msg):
        """By address: an executor's message to its executor or to its process's stub, another
        stub's answer to it; by type what is for this stub: its executors' requests and stops,
        the servers' answers."""
        dst = msg.dst
        if self.away:
            origin = self.origin(msg)
            if origin in self.away and (self.returned is None or self.returned(origin)):
                self.come_back(origin)
        if msg.type == m.kUpdate:
            self.note_step(msg.trgt_version)
        if m.addr_type(dst) != m.kStub:
            self.send(msg)
            return
        if dst != m.STUB and m.addr_id(dst) != self.pid:
            if self.peers is None:
                raise ClusterError(f"message for the stub of process {m.addr_id(dst)}, "
                                   f"in a job of one process")
            if m.addr_id(dst) not in self.away:
                self.peers(m.addr_id(dst)).send(msg)
            return
        t = msg.type
        if t in (m.kRPut, m.kRGet, m.kRUpdate, m.kRState):
            self.handle_response(msg)
        elif t == m.kSnapshot:     # from another process: later, if ours are there already
            step = msg.trgt_version
            self.spread_snapshot(step if step > self.latest + 1 else self.latest + self.lead())
        elif t == m.kStop and m.addr_type(msg.src) == m.kStub:     # another stub's farewell
            self.ended[m.addr_id(msg.src)] = bytes(msg.frames[0]).decode(errors="replace") \
                if msg.frames else ""
        elif msg.src not in self.executors:
            raise ClusterError(f"request of type {t} from an executor this process does not run")
        elif t == m.kStop:
            self.executors.discard(msg.src)
            if m.addr_type(msg.src) == m.kServer:
                self.servers -= 1
            else:
                self.workers -= 1
                for server in self.farewells.get(msg.src, ()):
                    self.send(m.Msg(msg.src, server, m.kStop))
        elif t == m.kError:
            self.handle_error(msg)
        elif t == m.kPut:
            self.handle_put(msg)
        elif t == m.kGet:
            self.handle_get(msg)
        elif t == m.kUpdate:
            self.handle_update(msg)
        elif t == m.kState:
            self.handle_state(msg)
        else:
            raise ClusterError(f"unexpected message type {t} for the stub")

    def origin(self, msg):
        """The process `msg` comes from: its source stub's, or its source executor's."""
        if m.addr_type(msg.src) == m.kStub:
            return m.addr_id(msg.src)
        try:
            return self.pid if self.locate is None else self.locate(msg.src)
        except ClusterError:
            return None

    def note_step(self, step):
        """An Update of `step` passed: the newest step and the time a step takes."""
        if step <= self.latest:
            return
        now = time.monotonic()
        if self.latest_at is not None:
            dt = (now - self.latest_at) / (step - self.latest)
            self.step_seconds = dt if self.step_seconds is None else \
                0.9 * self.step_seconds + 0.1 * dt
        self.latest, self.latest_at = step, now

    def lead(self):
        """How many steps ahead a snapshot on signal is set."""
        if not self.step_seconds:
            return SNAPSHOT_MIN_LEAD
        return max(SNAPSHOT_MIN_LEAD, math.ceil(SNAPSHOT_LEAD_SECONDS / self.step_seconds))

    def spread_snapshot(self, step):
        """Workers stop after a snapshot at `step` (the latest one asked for wins): told here
        and, the first time or when later, every other process's stub."""
        if self.snapshot_at is not None and step <= self.snapshot_at:
            return
        self.snapshot_at = step
        log.info("Stub: a snapshot at step %d, then the job stops", step)
        for a in sorted(self.executors):
            if m.addr_type(a) != m.kServer:
                self.router.send(m.Msg(m.STUB, a, m.kSnapshot, 0, step))
        for pid in range(self.nprocs):
            if pid != self.pid and pid not in self.away:
                self.peers(pid).send(m.Msg(self.address(0), m.addr(0, pid, m.kStub),
                                           m.kSnapshot, 0, step))

    def stop_local(self, entity):
        """kStop to the running local executors of one kind (kServer) or of every kind."""
        for a in sorted(self.executors):
            if entity is None or m.addr_type(a) == entity:
                self.router.send(m.Msg(m.STUB, a, m.kStop))

    def handle_error(self, msg):
        kind, text = m.parse_error_frames(msg.frames)
        if self.error is None:
            self.error = (kind, text)
            log.error("%s failed: %s", "Server" if m.addr_type(msg.src) == m.kServer else "Worker",
                      text, extra=RAISED)
            self.stop_local(None)

    def entry(self, grp, owner):
        try:
            return self.entries[(grp, owner)]
        except KeyError:
            raise ClusterError(f"no param entry for group {grp}, param {owner}") from None

    def request_entry(self, msg):
        return self.entry(m.addr_grp(msg.src), m.param_id(msg.trgt_val))

    def handle_put(self, msg):
        """A worker's Put -> a Put per slice."""
        e = self.request_entry(msg)
        lr_scale, wd_scale, lr_index, arrays = pm.parse_put(msg, e.size)
        src = self.address(e.grp)
        for sid, server, o, n in e.slices:
            self.send(pm.slice_put(src, server, e.owner, sid, msg.trgt_version, lr_scale,
                                   wd_scale, e.num_total, lr_index, [a[o:o + n] for a in arrays]))

    def handle_get(self, msg):
        """The first Get of a version -> a Get per slice (the answer goes to every share)."""
        e = self.request_entry(msg)
        if msg.trgt_version <= e.next_version:
            return
        e.next_version = msg.trgt_version
        for sid, server, _, _ in e.slices:
            self.send(pm.request(self.address(e.grp), server, m.kGet, e.owner, msg.trgt_version,
                                 sid))

    def handle_update(self, msg):
        """A worker's bucket of gradients: each param's, once every local share has sent its
        own, summed; the slices so completed go one message per server."""
        grp = m.addr_grp(msg.src)
        grads = []
        for owner, frame in pm.parse_update(msg):      # checked whole before anything is kept
            e = self.entry(grp, owner)
            grads.append((e, m.frame_array(frame, e.size)))
        out = {}    # server -> [(owner, slice id, num_local, gradient)]
        for e, grad in grads:
            if e.grads is None:
                e.grads = m.OrderedSum(e.size)
            if e.grads.add(msg.src, grad) < e.num_local:
                continue
            g = e.grads.take()
            for sid, server, o, n in e.slices:
                out.setdefault(server, []).append(
                    (e.owner, sid, e.num_local, g if n == e.size else g[o:o + n]))
        for server, items in out.items():
            self.send(pm.slice_update(self.address(grp), server, msg.trgt_version, items))

    def handle_state(self, msg):
        """A worker asks for the updater state (a snapshot): a kState per slice; the answer
        goes to the workers that asked."""
        e = self.request_entry(msg)
        e.state_requests.append(msg.src)
        if len(e.state_requests) > 1:
            return
        for sid, server, _, _ in e.slices:
            self.send(pm.request(self.address(e.grp), server, m.kState, e.owner,
                                 msg.trgt_version, sid))

    def handle_response(self, msg):
        """Answers of slices (a kRUpdate's several); once every slice of a param has answered,
        its shares get the answers: every local share for values, the workers that asked for
        the updater state; one message per worker and version."""
        grp = m.addr_grp(msg.dst)
        items = pm.parse_updated(msg) if msg.type == m.kRUpdate else \
            [(m.param_id(msg.trgt_val), m.slice_id(msg.trgt_val), msg.frames)]
        answers = []
        for owner, sid, frames in items:       # checked whole before anything is kept
            e = self.entry(grp, owner)
            i = e.index.get(sid)
            if i is None:
                raise ClusterError(f"answer for unknown slice {sid}")
            answers.append((e, i, frames))
        out = {}    # (worker, version) -> [(param id, offsets, answers)]
        for e, i, frames in answers:
            got = e.answers.setdefault(msg.type, {})
            got[i] = (msg.trgt_version, frames)
            if len(got) < len(e.slices):
                continue
            del e.answers[msg.type]
            version = min(v for v, _ in got.values())
            slices = [got[k][1] for k in range(len(e.slices))]
            shares = e.shares
            if msg.type == m.kRState:
                asked, e.state_requests = set(e.state_requests), []
                shares = [s for s in e.shares if s[0] in asked]
            for worker, pid in shares:
                out.setdefault((worker, version), []).append((pid, e.offsets, slices))
        for (worker, version), params in out.items():
            self.router.send(pm.gathered(msg.dst, worker, msg.type, version, params))
