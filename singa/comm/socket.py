"""Dealer, Router and Peer: how messages reach the executors (SINGA's src/comm/socket.cc).

A Dealer is an executor's (worker's or server's) connection to its process's stub; the Router
is the stub's. Inside a process a message is handed over as it is, a queue per receiver: its
array frames are the sender's arrays (of the host or of a GPU), which must stay unchanged
until read, so a server updates its workers' params where they are. Across processes a Peer
sends it over ZeroMQ tcp to the other process's Router (a GPU array's values copied to the
host), where a thread of the Router's own reads it into the Router's queue: such frames are
bytes (zmq Frames), never references to memory.
"""
import queue
import threading

import zmq

from singa.comm.msg import Msg, host_frame
from singa.errors import ClusterError

#: ZMTP heartbeats of a Peer, in ms: a PING every HEARTBEAT_IVL; a connection that has heard
#: nothing for HEARTBEAT_TIMEOUT after one is dropped. The other process's libzmq I/O thread
#: answers, not Python, so a busy process (its GIL held, its cores loaded) still does in time;
#: a frozen one (SIGSTOP) does not. A killed one drops the connection at once (its kernel
#: closes the socket).
HEARTBEAT_IVL, HEARTBEAT_TIMEOUT = 500, 2000
#: ms a closing Peer still tries to deliver what it was sent (a farewell to the other stub)
LINGER = 500
#: ms the Router's reader waits for a Peer's message before it looks whether to stop
READ_POLL_MS = 20


#: the Routers of this process by their `inproc://` endpoint, where Dealers find them
_ROUTERS = {}


def _take(inbox, timeout_ms):
    """The next message of `inbox`, or None after `timeout_ms` milliseconds; a ClusterError
    queued for it (a bad message from another process) is raised."""
    try:
        item = inbox.get(timeout=timeout_ms / 1000) if timeout_ms > 0 else inbox.get_nowait()
    except queue.Empty:
        return None
    if isinstance(item, ClusterError):
        raise item
    return item


class Dealer:
    """One executor's connection, by its address, to the Router at `endpoint`; executors of
    one thread may share an `inbox` (a worker's params and its bridge layers)."""

    def __init__(self, address, endpoint, inbox=None):
        try:
            self.router = _ROUTERS[endpoint]
        except KeyError:
            raise ClusterError(f"no stub at {endpoint} in this process") from None
        self.address = address
        self.inbox = queue.SimpleQueue() if inbox is None else inbox
        self.router.dealers[address] = self.inbox

    def send(self, msg):
        self.router.inbox.put(msg)

    def receive(self, timeout_ms):
        """The next message, or None after `timeout_ms` milliseconds."""
        return _take(self.inbox, timeout_ms)

    def close(self):
        self.router.dealers.pop(self.address, None)


class Peer:
    """A send-only connection to another process's stub (its Router's tcp endpoint); with a
    `trust` (`singa.comm.trust.JobTrust`) a CURVE client of the job's keys. Every message starts
    with a frame of the job's id, which the Router checks. The connection carries heartbeats;
    a `watched` Peer has `events`, a socket of its connection's events (handshake succeeded,
    disconnected: `zmq.utils.monitor`), for one other thread to read
    (`singa.comm.liveness.PeerWatch`)."""

    def __init__(self, ctx, endpoint, trust=None, job=-1, watched=False):
        self.endpoint = endpoint
        self.job = b"%d" % job
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, LINGER)
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL)
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT)
        if trust is not None:
            self.sock.curve_serverkey = trust.server_public
            self.sock.curve_publickey = trust.client_public
            self.sock.curve_secretkey = trust.client_secret
        self.events = self.sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED) if watched else None
        self.sock.connect(endpoint)     # after the options and the monitor: they take from here

    def send(self, msg, wait=True):
        """Queue `msg` for the other process; not `wait`ing, a full queue (a process that
        reads nothing) drops it."""
        try:
            self.sock.send_multipart([self.job, msg.header(), *map(host_frame, msg.frames)],
                                     copy=False,
                                     flags=0 if wait else zmq.DONTWAIT)
        except zmq.Again:
            pass

    def unwatch(self):
        """No more `events` (before their reader stops reading them)."""
        self.sock.disable_monitor()

    def close(self):
        """Close the connection (a watched one's events stopped first: `PeerWatch.close`)."""
        self.sock.close()


class Router:
    """The stub's end: receives from every Dealer of its process and from other processes'
    Peers (once it listens on tcp: `bind`), sends to a Dealer by its address."""

    def __init__(self, ctx, endpoint, job=-1):
        """`endpoint`: `inproc://<name>`, where this process's Dealers find it, or a tcp
        endpoint to `bind`; `job`: the id a Peer's messages must carry (those of another job
        or an earlier run are dropped)."""
        self.ctx, self.job = ctx, b"%d" % job
        self.inbox = queue.SimpleQueue()
        self.dealers = {}       # address -> the inbox of its Dealer
        self.sock = self.reader = None
        self.closing = False
        if endpoint.startswith("inproc://"):
            if endpoint in _ROUTERS:
                raise ClusterError(f"cannot bind {endpoint}: another stub of this process has it")
            _ROUTERS[endpoint] = self
            self.endpoint = endpoint
        else:
            self.endpoint = self.bind(endpoint)

    def bind(self, endpoint, trust=None, max_frame=-1):
        """Listen on tcp `endpoint` (e.g. `tcp://10.0.0.2:*`), once; returns the bound
        endpoint. With a `trust` (`singa.comm.trust.JobTrust`) as the CURVE server of the job's
        keys, which only its clients pass (the context's ZAP handler must admit them); a peer
        sending a frame over `max_frame` bytes (-1: no limit) is disconnected before it is
        received."""
        if self.sock is not None:
            raise ClusterError(f"cannot bind {endpoint}: this stub listens already")
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        if trust is not None:
            sock.curve_server = True
            sock.curve_publickey = trust.server_public
            sock.curve_secretkey = trust.server_secret
        sock.setsockopt(zmq.MAXMSGSIZE, max_frame)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as e:
            sock.close(0)
            raise ClusterError(f"cannot bind {endpoint}: {e}") from None
        self.sock = sock
        self.reader = threading.Thread(target=self._read, name="singa-router", daemon=True)
        self.reader.start()
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def _read(self):
        """The reader thread: queue what Peers send (a ClusterError for a message not of this
        job, or malformed), until `close`."""
        while not self.closing:
            try:
                if not self.sock.poll(READ_POLL_MS):
                    continue
                frames = self.sock.recv_multipart(copy=False)
            except zmq.ZMQError:
                return
            self.inbox.put(self._from_peer(frames))

    def _from_peer(self, frames):
        """The Msg of a Peer's `frames` [identity, job, header, body...], or a ClusterError."""
        if len(frames) < 3 or frames[1].bytes != self.job:
            job = frames[1].bytes[:20] if len(frames) > 1 else b""
            return ClusterError(f"a message of another job ({job!r}), not of job "
                                f"{self.job.decode()}")
        try:
            return Msg.from_frames(frames[2:])
        except ClusterError as e:
            return e

    def send(self, msg):
        """To the local executor at `msg.dst`."""
        inbox = self.dealers.get(msg.dst)
        if inbox is None:
            raise ClusterError(f"cannot deliver {msg}: no executor at {msg.dst} in this process")
        inbox.put(msg)

    def receive(self, timeout_ms):
        """The next message, or None after `timeout_ms` milliseconds; ClusterError for a
        message of another process that is not of this job (dropped)."""
        return _take(self.inbox, timeout_ms)

    def close(self):
        self.closing = True
        if self.reader is not None:
            self.reader.join()
            self.sock.close(0)
        if _ROUTERS.get(self.endpoint) is self:
            del _ROUTERS[self.endpoint]
