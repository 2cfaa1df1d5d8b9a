"""PeerWatch: which other processes of a job are still there, from their connections alone.

Every process holds a Peer to every other (runtime.Process.watch_peers); a Peer's connection
carries ZMTP heartbeats (`socket.HEARTBEAT_IVL`, `HEARTBEAT_TIMEOUT`). A killed process's
connection drops at once, a frozen one's when its heartbeats stop; ZeroMQ then reconnects. A
connection that has been up and stays down for DOWN_GRACE s is taken for the process's end,
without ZooKeeper (whose session timeout, `zk.SESSION_TIMEOUT`, is kept long for loaded
machines): the caller decides whether that end was a loss (its farewell or proc-done mark).
"""
import logging
import queue
import threading
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger("singa")

#: seconds a connection that was up stays down before its process is taken for ended: a
#: reconnect within it is no loss, and a farewell sent before the close has arrived by then
DOWN_GRACE = 1.0


class PeerWatch:
    """Watches the connections of `peers` ({procs id: watched Peer}) in a thread of its own:
    `on_down(procs id)` is called there, once per process, when a connection that has been up
    has stayed down for DOWN_GRACE s. The thread reads the Peers' `events` until `close`: a
    socket's monitor that nobody reads blocks ZeroMQ's I/O thread, and with it every socket of
    the context."""

    def __init__(self, peers, on_down):
        self.peers, self.on_down = peers, on_down
        self.quiet, self.closing = threading.Event(), threading.Event()
        self.added = queue.SimpleQueue()
        self.lock, self.finished = threading.Lock(), False   # the thread has closed its sockets
        self.thread = threading.Thread(target=self.run, name="peer-watch", daemon=True)

    def start(self):
        self.thread.start()

    def add(self, pid, peer):
        """Watch `peer` (watched) for process `pid` from now on, in place of its earlier one
        (closed: a restarted process's new connection). Thread-safe. Once the watch has ended
        (a farewell to a restarted process connects it late), its events are closed at once:
        an open socket would keep the context from terminating."""
        with self.lock:
            if not self.finished:
                self.added.put((pid, peer))
                return
        peer.unwatch()
        peer.events.close(0)

    def stop(self):
        """No more `on_down` (this process ends: the others' ends are no news). Thread-safe."""
        self.quiet.set()

    def close(self):
        """Stop the Peers' monitors, then the thread; from the thread that owns the Peers,
        before they close. Idempotent."""
        self.quiet.set()
        if self.closing.is_set():
            return
        for peer in self.peers.values():
            peer.unwatch()
        self.closing.set()
        if self.thread.is_alive():
            self.thread.join()

    def run(self):
        events = {peer.events: pid for pid, peer in self.peers.items()}
        poller = zmq.Poller()
        for sock in events:
            poller.register(sock, zmq.POLLIN)
        up, down_since, ended = set(), {}, set()
        try:
            while not self.closing.is_set():
                while not self.added.empty():
                    pid, peer = self.added.get()
                    for sock in [s for s, p in events.items() if p == pid]:
                        poller.unregister(sock)
                        del events[sock]
                        sock.close(0)
                    events[peer.events] = pid
                    poller.register(peer.events, zmq.POLLIN)
                    up.discard(pid), ended.discard(pid), down_since.pop(pid, None)
                for sock, _ in poller.poll(100):
                    pid, event = events[sock], recv_monitor_message(sock)["event"]
                    if pid in ended:
                        continue
                    if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                        up.add(pid)
                        down_since.pop(pid, None)
                    elif event == zmq.EVENT_DISCONNECTED and pid in up:
                        down_since.setdefault(pid, time.monotonic())
                now = time.monotonic()
                for pid, since in sorted(down_since.items()):
                    if now - since >= DOWN_GRACE and not self.quiet.is_set():
                        del down_since[pid]
                        ended.add(pid)
                        try:
                            self.on_down(pid)
                        except Exception:       # the thread must go on reading
                            log.exception("Peer watch: process %d", pid)
        finally:
            with self.lock:     # Peers added since the last turn: their events close too
                self.finished = True
                while not self.added.empty():
                    events[self.added.get()[1].events] = None
            for sock in events:
                sock.close(0)
