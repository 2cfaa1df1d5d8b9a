"""Membership: the other processes of a job as a process's stub knows them: those reported lost,
those that said farewell, and, in an elastic job, those away until their restart rejoins.

The loss of an elastic process (`topology.elastic_procs`) does not stop the job while
ZooKeeper answers: the process is away, and nothing is sent to it, until a message of its
restart arrives, for at most `rejoin_timeout` s.
"""
import logging
import threading
import time

log = logging.getLogger("singa")


class Membership:
    """The stub's bookkeeping of the job's other processes.

    `elastic`: the procs ids whose loss this process rides out; `forget(pid)` drops the
    connection to a process that left, `returned(pid)` says whether it registered again (not
    a late message of the lost one); while `rejoinable()` is false (ZooKeeper away) a loss
    stops the job."""

    def __init__(self, elastic=(), forget=None, returned=None, rejoin_timeout=60.0,
                 rejoinable=None):
        self.elastic, self.forget, self.returned = set(elastic), forget, returned
        self.rejoin_timeout = rejoin_timeout
        self.rejoinable = rejoinable or (lambda: True)
        self.away = {}              # procs id -> (why it left, deadline to come back)
        self.ended = {}             # procs id -> its proc-done mark, from its farewell
        self.lost = set()           # the procs ids reported lost
        self.lock = threading.Lock()

    def first_report(self, procs_id):
        """Whether this report of the loss of process `procs_id` (None: unknown or several)
        is the first since it (re)joined. Thread-safe."""
        with self.lock:
            if procs_id in self.lost:
                return False
            if procs_id is not None:
                self.lost.add(procs_id)
        return True

    def rides_out(self, procs_id):
        """Whether the loss of process `procs_id` leaves it away instead of stopping the job."""
        return procs_id in self.elastic and self.rejoinable()

    def leave(self, procs_id, text, step):
        """Elastic process `procs_id` is lost (`text`) at `step`: its worker groups leave, this
        process goes on and drops what is sent to it until it comes back."""
        self.away[procs_id] = (text, time.monotonic() + self.rejoin_timeout)
        if self.forget is not None:
            self.forget(procs_id)
        log.warning("%s: its worker groups leave at step %d; the job goes on, and they join "
                    "again when it restarts (within %.0f s)", text, step, self.rejoin_timeout)

    def returning(self, procs_id):
        """Whether a message from process `procs_id` is one of its restart, back from away."""
        return procs_id in self.away and (self.returned is None or self.returned(procs_id))

    def come_back(self, procs_id, step):
        """Process `procs_id` restarted (seen at `step`): messages to it go to its new
        endpoint, and its next loss is news."""
        if self.away.pop(procs_id, None) is None:
            return
        with self.lock:
            self.lost.discard(procs_id)
        self.ended.pop(procs_id, None)
        log.info("Process %d rejoined the job at step %d: its worker groups take the servers' "
                 "params", procs_id, step)

    def overdue(self):
        """Why the job stops when a process is away for longer than `rejoin_timeout` (None
        while none is)."""
        now = time.monotonic()
        for text, deadline in self.away.values():
            if now > deadline:
                return f"{text}, and did not rejoin within {self.rejoin_timeout:.0f} s"
        return None
