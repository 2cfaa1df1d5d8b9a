"""ZooKeeper: a session with the ensemble (SINGA's ZKService, src/utils/cluster_rt.cc).

SINGA's znodes, used by `cluster_rt.ZKClusterRuntime` (a job's processes and groups) and
`job_manager.JobManager` (job ids, hosts, listing):
  /singa/sys/job-lock/lock-<seq>          ephemeral-sequential; job id = the sequence number
  /singa/sys/host-idx                     next host of conf/hostfile (round-robin across jobs)
  /singa/app/job-<%010d>/proc/proc-<id>   ephemeral, "<host>:<port>|<pid>"
  /singa/app/job-<%010d>/proc-lock/lock-<seq>   ephemeral-sequential; procs id = rank
  /singa/app/job-<%010d>/group/sg<s>/g<gid>_w<wid>   ephemeral; a worker in server group s
  /singa/app/job-<%010d>/proc-done/proc-<id>   ours: process id ended normally (so its proc
                                               node's end is no loss)
  /singa/app/job-<%010d>/proc-lost/proc-<id>   ours: "<host>:<port>" of process id as another
                                               took it for lost (an elastic one learns it
                                               there on waking from a freeze, and restarts)
"""
import logging
import socket
import time

from kazoo.client import KazooClient
from kazoo.exceptions import (BadVersionError, KazooException, NoAuthError, NodeExistsError,
                              NoNodeError)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import make_acl

from singa.errors import ClusterError, ConfigError

ROOT = "/singa"
SYS = "/singa/sys"
JOB_LOCK = "/singa/sys/job-lock"
HOST_IDX = "/singa/sys/host-idx"
APP = "/singa/app"
SESSION_TIMEOUT = 10.0     # seconds (SINGA's 30,000 ms): how soon a killed process is seen lost
#: a connect's answer is awaited for 1/CONNECT_SHARE of the session timeout (`_listed`)
CONNECT_SHARE = 4
SHUTDOWN_TIMEOUT = 3.0     # seconds a call on the way out may wait (its ephemeral node expires anyway)
#: the shared nodes: every user of SINGA reads, writes, creates and deletes, nobody changes
#: their ACL (ADMIN), so no stranger can lock later launches out
SHARED_ACL = [make_acl("world", "anyone", read=True, write=True, create=True, delete=True)]

log = logging.getLogger("singa")
# kazoo warns on every failed connection attempt; our errors say it in one line instead.
logging.getLogger("kazoo").addHandler(logging.NullHandler())


class ProtectedNode(ClusterError):
    """ZooKeeper refused a change: the node belongs to a job whose secret we do not hold."""


def job_path(job_id):
    return f"{APP}/job-{job_id:010d}"


def zookeeper_answers(hosts, timeout=2.0, wait_refused=True, waiting=None):
    """True once a ZooKeeper session to `hosts` opens, trying for up to `timeout` seconds.

    A server listens before it serves (ZooKeeperServerMain binds its port, then loads its data;
    sessions are refused meanwhile) and that takes seconds on a loaded machine: 2-4 s under a
    load of 7 on two cores, against 0.3 s on a free one. So the whole `timeout` is spent
    trying, also while nothing listens yet, unless `wait_refused` is False: then a host that
    refuses TCP ends the check at once (the launcher starts a server of its own there).
    `waiting(line)` hears one line, once, when the first second has not been enough: what is
    waited for and for how long at most."""
    deadline = time.monotonic() + timeout
    said = False
    while True:
        left = deadline - time.monotonic()
        why = _refusals(hosts, max(left, 0.1))
        if why and not wait_refused:
            return False
        if not why:
            try:
                # a session timeout as short as the try: it bounds kazoo's reads, and with them
                # how far a server that never replies makes the try overrun
                wait = max(left if said else min(left, 1.0), 0.1)
                client = _session(hosts, wait, session_timeout=wait)
            except ClusterError:
                why = "it listens but opens no session yet"
            else:
                client.stop()
                client.close()
                return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not said and waiting is not None:
            waiting(f"waiting up to {timeout:g} s for ZooKeeper at {hosts} to open a session "
                    f"({why})")
        said = True
        time.sleep(min(0.2, left))


class ZKService:
    """A session with the ZooKeeper ensemble `hosts` ("h1:2181,h2:2181[/chroot]").

    Every call waits at most `timeout` seconds for ZooKeeper and raises ClusterError otherwise;
    ZooKeeper's own errors (NoNode, NodeExists, BadVersion) pass through.
    """

    def __init__(self, hosts, timeout=15, trust=None):
        """`trust` (a `singa.comm.trust.JobTrust`): the session authenticates as that job, and may
        then change the job's nodes."""
        self.hosts = hosts
        self.timeout = timeout
        self.client = _connect(hosts, timeout, trust.zk_auth if trust is not None else None)
        try:
            for path in (ROOT, SYS, JOB_LOCK, APP):
                self.ensure(path)
            self.ensure(HOST_IDX, b"0")
        except ClusterError:
            self.close()
            raise

    def close(self):
        """End the session (ZooKeeper deletes its ephemeral nodes); on the way out, so a
        failure is a warning."""
        try:
            self.client.stop()
            self.client.close()
        except KazooException as e:
            log.warning("ZooKeeper at %s: closing the session failed: %s", self.hosts, e)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def connected(self):
        return self.client.connected

    def ensure(self, path, value=b"", acl=None):
        """Create a persistent node (and its parents, with the same `acl`; None: SHARED_ACL);
        an existing node counts as success."""
        try:
            self.wait(self.client.create_async(path, value, acl=acl or SHARED_ACL,
                                               makepath=True),
                      "create " + path)
        except NodeExistsError:
            pass

    def children(self, path):
        return self.wait(self.client.get_children_async(path), "list " + path)

    def delete_tree(self, path):
        """Delete `path` and everything below it; a node gone already counts as deleted.
        Returns the nodes left because they belong to a job (`ProtectedNode`)."""
        left = []
        try:
            for child in self.children(path):
                left += self.delete_tree(f"{path}/{child}")
            if not left:
                self.wait(self.client.delete_async(path), "delete " + path)
        except NoNodeError:
            pass
        except ProtectedNode:
            left.append(path)
        return left

    def wait(self, result, what, timeout=None):
        """The value of a kazoo async call within `timeout` (default self.timeout) seconds;
        lost connections and timeouts become ClusterError naming `what`."""
        timeout = self.timeout if timeout is None else timeout
        try:
            return result.get(timeout=timeout)
        except (NoNodeError, NodeExistsError, BadVersionError):
            raise
        except NoAuthError:
            raise ProtectedNode(f"ZooKeeper at {self.hosts} refused to {what}: the node belongs "
                                f"to a job whose secret this process does not hold") from None
        except KazooTimeoutError:
            raise ClusterError(f"ZooKeeper at {self.hosts} did not answer within "
                               f"{timeout:g} s ({what})") from None
        except KazooException as e:
            raise ClusterError(f"ZooKeeper at {self.hosts} failed ({what}): {type(e).__name__}") from None


def _connect(hosts, timeout, auth=None):
    """A started KazooClient (authenticated with `auth`, kazoo's auth_data), or ClusterError
    within `timeout` seconds."""
    _probe(hosts, timeout)
    return _session(hosts, timeout, auth)


def _session(hosts, timeout, auth=None, session_timeout=SESSION_TIMEOUT):
    """`_connect` without the probe: kazoo tries until `timeout`."""
    client = KazooClient(hosts=_listed(hosts, CONNECT_SHARE), timeout=session_timeout,
                         auth_data=auth,
                         connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1})
    try:
        client.start(timeout=timeout)
    except (KazooTimeoutError, KazooException) as e:    # start() has stopped the client already
        raise ClusterError(f"cannot reach ZooKeeper at {hosts} within {timeout:g} s") from e
    return client


def _listed(hosts, times):
    """`hosts` ("h1:p1,h2[/chroot]") with each host listed `times` times. Kazoo waits
    session timeout / (hosts listed) for the answer to a connect; a server still starting
    accepts the connection and never answers it, so with each host once a client that
    reconnects at that moment waits a whole session timeout and its session expires (the
    process is taken for lost after a ZooKeeper restart it should ride through)."""
    servers, slash, chroot = hosts.partition("/")
    return ",".join([servers] * times) + slash + chroot


def route_address(hosts):
    """This host's address on the route to the first ZooKeeper of `hosts` (a UDP socket's
    connect picks it and sends nothing): the address the others reach this process at."""
    host, port = _addresses(hosts)[0]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError as e:
        raise ClusterError(f"no route to ZooKeeper at {host}:{port}: {e.strerror}") from None


def _probe(hosts, timeout):
    """Fail at once when no host of `hosts` accepts TCP (kazoo would retry until `timeout`)."""
    reasons = _refusals(hosts, timeout)
    if reasons:
        raise ClusterError(f"cannot reach ZooKeeper at {hosts} ({reasons})")


def _refusals(hosts, timeout):
    """None when a host of `hosts` accepts TCP within `timeout` seconds (5 at most), else
    why none does ("h:p Connection refused; unknown host x")."""
    reasons = []
    for host, port in _addresses(hosts):
        try:
            socket.create_connection((host, port), timeout=min(timeout, 5)).close()
            return None
        except socket.gaierror:
            reasons.append(f"unknown host {host}")
        except OSError as e:
            reasons.append(f"{host}:{port} {e.strerror or 'timed out'}")
    return "; ".join(reasons)


def _addresses(hosts):
    """[(host, port)] of "h1:p1,h2[/chroot]" (port 2181 when absent)."""
    out = []
    for item in hosts.split("/", 1)[0].split(","):
        host, _, port = item.strip().rpartition(":")
        if not host:
            host, port = port, "2181"
        if not port.isdigit():
            raise ConfigError(f"zookeeper_host {hosts!r}: bad port {port!r}")
        out.append((host, int(port)))
    return out
