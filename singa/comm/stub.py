"""Stub: the message router of a process (SINGA's src/stub.cc), run by the main thread.

Workers' Put / Get / Update / State requests go through it to the servers, sent as the stub
itself (`address(grp)`, SINGA's Addr(grp, procs_id, kStub)); the servers answer that address
and, once every slice has answered, the stub gives each share the answer: its
`param_table.ParamTable` makes those messages, from a ParamEntry per (worker group, owner
param). Everything is routed by its destination address: an executor's here or at its process's stub
over tcp (`peers`), another stub's by the process id in it. A failure (kError) stops every
local executor; `run` then returns it as (type name, message). A process on its way out tells
every other stub (`farewell`: a kStop from stub to stub, with its proc-done mark), so that its
dropped connection is known for an end, not a loss, without ZooKeeper. Which processes are
lost, ended or away (an elastic job) is the stub's `membership.Membership`.

In a job of several processes a local worker joins its servers as the stub starts (kConnect)
and says farewell (kStop) when it ends on its own (its last step, or a snapshot the job stops
after), both with this process's `incarnation`; a worker the stub stops (a signal, a failure,
a lost ZooKeeper session) did not finish and says none: its process may restart and rejoin,
and its servers wait for it.
"""
import logging
import math
import queue
import time

from singa.comm import msg as m
from singa.comm.membership import Membership
from singa.comm.param_table import ParamTable
from singa.errors import ClusterError
from singa.log import RAISED

log = logging.getLogger("singa")

#: a snapshot on signal is taken some 0.25 s of steps (at least 3) after the newest step seen,
#: so that every worker of the job hears of it before it gets there
SNAPSHOT_LEAD_SECONDS, SNAPSHOT_MIN_LEAD = 0.25, 3


class Stub:
    """Routes messages among the executors of this process until they have all stopped."""

    def __init__(self, router, entries, executors, poll_ms=100, pid=0, locate=None, peers=None,
                 stop_servers_with_workers=True, farewells=None, nprocs=1, members=None,
                 served=None):
        """`locate(address)` is the process of an executor (None: all are here); `peers(pid)`
        the Peer connection to another process's stub (of `nprocs`); `farewells` maps a local
        worker to the servers it joins and says farewell to, `served` a local server to the
        workers whose farewells end it. `members`: the Membership of the job's processes
        (elastic ones among them; None: none is)."""
        self.nprocs = nprocs
        self.members = members or Membership()
        self.latest = 0             # the newest step an Update passing here was of
        self.latest_at = None       # when it was seen
        self.step_seconds = None    # a running mean of the time a step takes
        self.snapshot_at = None     # the step every worker stops at after a snapshot
        self.farewells = farewells or {}
        self.served = served or {}
        self.gone = set()           # workers whose farewell passed here to a local server
        self.router = router
        self.pid, self.locate, self.peers = pid, locate, peers
        self.stop_servers_with_workers = stop_servers_with_workers
        self.table = ParamTable(entries, pid)     # entries: {(grp, owner id): ParamEntry}
        self.executors = set(executors)     # addresses of the local executors still running
        self.workers = sum(m.addr_type(a) != m.kServer for a in self.executors)
        self.servers = len(self.executors) - self.workers
        self.poll_ms = poll_ms
        self.requests = queue.SimpleQueue()     # (what, arg[, procs id]) from other threads
        self.error = None
        self.halted = False         # the stub stopped the executors: no farewell to the servers
        self.incarnation = 0        # this registration of the process (the cluster runtime's)
        self.heard = time.monotonic()           # when the last message arrived

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
        if not self.members.first_report(procs_id):
            return False
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
            if pid != self.pid and pid not in self.members.away:
                self.peers(pid).send(m.Msg(self.address(0), m.addr(0, pid, m.kStub), m.kStop,
                                           frames=[mark.encode()]), wait=False)

    def run(self):
        """Route until every local executor has stopped; the first failure, or None."""
        log.info("Stub in process starts")
        self.tell_servers(m.kConnect)
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
            if self.members.away:
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
            if procs_id in self.members.away:
                return
            if self.error is None and self.members.rides_out(procs_id):
                self.members.leave(procs_id, text, self.latest)
                return
            if self.error is None:
                self.error = ("ClusterError", text)
                log.error("%s; stopping", text)
        self.stop_local(None)

    def check_away(self):
        """A process away for longer than the membership's `rejoin_timeout`: the job stops.
        While the job stops for a snapshot (which no restart rejoins) a local server stops
        once each of its workers has said farewell or is on a process away."""
        if self.snapshot_at is not None:
            for server, workers in sorted(self.served.items()):
                if server in self.executors and all(
                        w in self.gone or self.locate(w) in self.members.away for w in workers):
                    log.info("Stub: server (group = %d, id = %d) stops with the job: its "
                             "workers have left or are away", m.addr_grp(server),
                             m.addr_id(server))
                    self.router.send(m.Msg(m.STUB, server, m.kStop))
                    self.served.pop(server)
        late = self.members.overdue()
        if late is not None and self.error is None:
            self.error = ("ClusterError", late)
            log.error("%s; stopping", late)
            self.stop_local(None)

    def send(self, msg):
        """To a local executor through the router, else to its process's stub."""
        where = self.pid if self.locate is None else self.locate(msg.dst)
        if where == self.pid:
            if msg.type in (m.kStop, m.kConnect) and m.addr_type(msg.src) == m.kWorkerParam:
                (self.gone.add if msg.type == m.kStop else self.gone.discard)(msg.src)
            self.router.send(msg)
        elif where not in self.members.away:
            self.peers(where).send(msg)

    def address(self, grp):
        """This stub's address for worker group `grp`."""
        return self.table.address(grp)

    def handle(self, msg):
        """By address: an executor's message to its executor or to its process's stub, another
        stub's answer to it; by type what is for this stub: its executors' requests and stops,
        the servers' answers."""
        dst = msg.dst
        if self.members.away:
            origin = self.origin(msg)
            if origin in self.members.away:
                if not self.members.returning(origin):
                    return      # of the process taken for lost (woken from a freeze): dropped
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
            if m.addr_id(dst) not in self.members.away:
                self.peers(m.addr_id(dst)).send(msg)
            return
        t = msg.type
        if t in (m.kRPut, m.kRGet, m.kRUpdate, m.kRState):
            for answer in self.table.answer(msg):
                self.router.send(answer)
        elif t == m.kSnapshot:     # from another process: later, if ours are there already
            step = msg.trgt_version
            self.spread_snapshot(step if step > self.latest + 1 else self.latest + self.lead())
        elif t == m.kStop and m.addr_type(msg.src) == m.kStub:     # another stub's farewell
            self.members.ended[m.addr_id(msg.src)] = \
                bytes(msg.frames[0]).decode(errors="replace") if msg.frames else ""
        elif msg.src not in self.executors:
            raise ClusterError(f"request of type {t} from an executor this process does not run")
        elif t == m.kStop:
            self.executors.discard(msg.src)
            if m.addr_type(msg.src) == m.kServer:
                self.servers -= 1
            else:
                self.workers -= 1
                if not self.halted:
                    self.tell_servers(m.kStop, msg.src)
        elif t == m.kError:
            self.handle_error(msg)
        elif t in self.table.requests:
            for request in self.table.request(msg):
                self.send(request)
        else:
            raise ClusterError(f"unexpected message type {t} for the stub")

    def come_back(self, pid):
        """Process `pid` rejoined: told of a snapshot the job stops after, if one is set."""
        if pid not in self.members.away:
            return
        self.members.come_back(pid, self.latest)
        if self.snapshot_at is not None:
            self.peers(pid).send(m.Msg(self.address(0), m.addr(0, pid, m.kStub), m.kSnapshot, 0,
                                       self.snapshot_at))

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
            if pid != self.pid and pid not in self.members.away:
                self.peers(pid).send(m.Msg(self.address(0), m.addr(0, pid, m.kStub),
                                           m.kSnapshot, 0, step))

    def tell_servers(self, what, worker=None):
        """The join (kConnect) or farewell (kStop) of local `worker` (None: every one) to its
        servers, with this process's incarnation."""
        for w, servers in sorted(self.farewells.items()):
            if worker is None or w == worker:
                for server in servers:
                    self.send(m.Msg(w, server, what, 0, self.incarnation))

    def stop_local(self, entity):
        """kStop to the running local executors of one kind (kServer) or of every kind (the
        workers then say no farewell)."""
        self.halted = self.halted or entity is None
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
