"""Dealer and Router: ZeroMQ endpoints carrying Msgs (SINGA's src/comm/socket.cc).

A Dealer is an executor's (worker's or server's) connection to its process's stub; the Router
is the stub's socket. Endpoints are `inproc://` inside a process and `tcp://` across processes;
the message layout is the same on both. Frames of 64 KB and more are sent without copying
(pyzmq's `copy_threshold`): in-process such an array frame aliases the sender's array. Device
frames (`singa.comm.msg`) stay in their process: a Peer sends their values, and a Router
refuses one from another process.
"""
import zmq

from singa.comm.msg import Msg, host_frame, is_device_frame
from singa.errors import ClusterError

#: ZMTP heartbeats of a Peer, in ms: a PING every HEARTBEAT_IVL; a connection that has heard
#: nothing for HEARTBEAT_TIMEOUT after one is dropped. The other process's libzmq I/O thread
#: answers, not Python, so a busy process (its GIL held, its cores loaded) still does in time;
#: a frozen one (SIGSTOP) does not. A killed one drops the connection at once (its kernel
#: closes the socket).
HEARTBEAT_IVL, HEARTBEAT_TIMEOUT = 500, 2000
#: ms a closing Peer still tries to deliver what it was sent (a farewell to the other stub)
LINGER = 500


def identity(address):
    return b"%d" % address


def over_tcp(frame):
    """Whether a received `frame` came from another process: ZeroMQ gives a tcp frame its
    peer's address as metadata and an inproc frame none. Not the identity, which a tcp peer
    may set to an executor's."""
    try:
        frame.get("Peer-Address")
        return True
    except zmq.ZMQError:
        return False


class Dealer:
    """One executor's socket, identified by its address, connected to a Router endpoint."""

    def __init__(self, ctx, address, endpoint):
        self.address = address
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, identity(address))
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, msg):
        self.sock.send_multipart([msg.header(), *msg.frames], copy=False)

    def receive(self, timeout_ms):
        """The next message, or None after `timeout_ms` milliseconds."""
        if not self.sock.poll(timeout_ms):
            return None
        return Msg.from_frames(self.sock.recv_multipart(copy=False))

    def close(self):
        self.sock.close(0)


class Peer:
    """A send-only connection to another process's stub (its Router's tcp endpoint); with a
    `trust` (`singa.trust.JobTrust`) a CURVE client of the job's keys. Every message starts
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
    """The stub's socket: receives from every Dealer, sends to a Dealer by its address."""

    def __init__(self, ctx, endpoint, job=-1):
        """`job`: the id a Peer's messages must carry (those of another job or an earlier run
        are dropped)."""
        self.job = b"%d" % job
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            self.sock.bind(endpoint)
        except zmq.ZMQError as e:
            raise ClusterError(f"cannot bind {endpoint}: {e}") from None
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def bind(self, endpoint, trust=None, max_frame=-1):
        """Also listen on `endpoint` (e.g. `tcp://10.0.0.2:*`); returns the bound endpoint.
        With a `trust` (`singa.trust.JobTrust`) as the CURVE server of the job's keys, which
        only its clients pass (the context's ZAP handler must admit them); a peer sending a
        frame over `max_frame` bytes (-1: no limit) is disconnected before it is received."""
        if trust is not None:
            self.sock.curve_server = True
            self.sock.curve_publickey = trust.server_public
            self.sock.curve_secretkey = trust.server_secret
        self.sock.setsockopt(zmq.MAXMSGSIZE, max_frame)
        try:
            self.sock.bind(endpoint)
        except zmq.ZMQError as e:
            raise ClusterError(f"cannot bind {endpoint}: {e}") from None
        return self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def send(self, msg):
        try:
            self.sock.send_multipart([identity(msg.dst), msg.header(), *msg.frames], copy=False)
        except zmq.ZMQError as e:
            raise ClusterError(f"cannot deliver {msg}: {e}") from None

    def receive(self, timeout_ms):
        if not self.sock.poll(timeout_ms):
            return None
        frames = self.sock.recv_multipart(copy=False)
        if len(frames) > 1 and over_tcp(frames[1]):    # a Peer: whatever identity it set
            if frames[1].bytes != self.job:
                raise ClusterError(f"a message of another job ({frames[1].bytes[:20]!r}), not "
                                   f"of job {self.job.decode()}")
            if any(map(is_device_frame, frames[3:])):
                raise ClusterError("a reference to device memory from another process")
            return Msg.from_frames(frames[2:])
        return Msg.from_frames(frames[1:])

    def close(self):
        self.sock.close(0)
