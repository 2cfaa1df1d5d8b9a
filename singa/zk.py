"""ZooKeeper: job ids, process registration, group membership and job listing, in SINGA's znodes.

Layout (SINGA's src/utils/cluster_rt.cc):
  /singa/sys/job-lock/lock-<seq>          ephemeral-sequential; job id = the sequence number
  /singa/sys/host-idx                     next host of conf/hostfile (round-robin across jobs)
  /singa/app/job-<%010d>/proc/proc-<id>   ephemeral, "<host>:<port>|<pid>"
  /singa/app/job-<%010d>/proc-lock/lock-<seq>   ephemeral-sequential; procs id = rank
  /singa/app/job-<%010d>/group/sg<s>/g<gid>_w<wid>   ephemeral; a worker in server group s
  /singa/app/job-<%010d>/proc-done/proc-<id>   ours: process id ended normally (so its proc
                                               node's end is no loss)
"""
import logging
import socket
import threading

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from singa.errors import ClusterError, ConfigError

ROOT = "/singa"
SYS = "/singa/sys"
JOB_LOCK = "/singa/sys/job-lock"
HOST_IDX = "/singa/sys/host-idx"
APP = "/singa/app"
SESSION_TIMEOUT = 10.0     # seconds (SINGA's 30,000 ms): how soon a killed process is seen lost
SHUTDOWN_TIMEOUT = 3.0     # seconds a call on the way out may wait (its ephemeral node expires anyway)
KEEP_IDLE_JOBS = 10        # jobs without processes are deleted once more newer jobs than this exist

log = logging.getLogger("singa")
# kazoo warns on every failed connection attempt; our errors say it in one line instead.
logging.getLogger("kazoo").addHandler(logging.NullHandler())


def job_path(job_id):
    return f"{APP}/job-{job_id:010d}"


def zookeeper_answers(hosts, timeout=2.0):
    """True when a ZooKeeper session to `hosts` can be opened within `timeout` seconds."""
    try:
        client = _connect(hosts, timeout)
    except ClusterError:
        return False
    client.stop()
    client.close()
    return True


class ZK:
    """A session with the ZooKeeper ensemble `hosts` ("h1:2181,h2:2181[/chroot]").

    Every call waits at most `timeout` seconds for ZooKeeper and raises ClusterError otherwise.
    """

    def __init__(self, hosts, timeout=15):
        self.hosts = hosts
        self.timeout = timeout
        self.client = _connect(hosts, timeout)
        try:
            for path in (ROOT, SYS, JOB_LOCK, APP):
                self._ensure(path)
            self._ensure(HOST_IDX, b"0")
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

    # --- job ids and hosts (singatool create / genhost) ---

    def new_job_id(self):
        """A new job id: the sequence number of a fresh /singa/sys/job-lock/lock- node."""
        path = self._wait(self.client.create_async(JOB_LOCK + "/lock-", ephemeral=True,
                                                   sequence=True), "create job lock")
        return int(path[-10:])

    def gen_hosts(self, hostfile, nprocs):
        """`nprocs` hosts from `hostfile`, round-robin from host-idx, which moves on by nprocs."""
        hosts = read_hostfile(hostfile)
        while True:
            data, stat = self._wait(self.client.get_async(HOST_IDX), "read host-idx")
            start = int(data or b"0")
            try:
                self._wait(self.client.set_async(HOST_IDX, str((start + nprocs) % len(hosts)).encode(),
                                                 version=stat.version), "write host-idx")
                break
            except BadVersionError:     # another job took hosts meanwhile; read again
                continue
        return [hosts[(start + i) % len(hosts)] for i in range(nprocs)]

    # --- processes of a job (the singa driver) ---

    def register_proc(self, job_id, endpoint, pid):
        """Register this process; returns its procs id (rank of its proc-lock node)."""
        self._ensure_job(job_id)
        job = job_path(job_id)
        lock = self._wait(self.client.create_async(job + "/proc-lock/lock-", ephemeral=True,
                                                   sequence=True), "create proc lock")
        locks = sorted(self._wait(self.client.get_children_async(job + "/proc-lock"), "list proc locks"))
        procs_id = locks.index(lock.rsplit("/", 1)[1])
        try:
            self._wait(self.client.create_async(f"{job}/proc/proc-{procs_id}", f"{endpoint}|{pid}".encode(),
                                                ephemeral=True), "create proc node")
        except NodeExistsError:
            raise ClusterError(f"procs id {procs_id} of job {job_id} is already registered "
                               f"in ZooKeeper at {self.hosts}") from None
        return procs_id

    def proc_endpoint(self, job_id, procs_id, timeout=None):
        """The endpoint ("host:port") of process `procs_id`, waiting for it to register."""
        path = f"{job_path(job_id)}/proc/proc-{procs_id}"
        timeout = self.timeout if timeout is None else timeout
        registered = threading.Event()
        if not self._wait(self.client.exists_async(path, watch=lambda event: registered.set()), "stat " + path):
            if not registered.wait(timeout):
                raise ClusterError(f"process {procs_id} of job {job_id} did not register in "
                                   f"ZooKeeper at {self.hosts} within {timeout:g} s")
        data, _ = self._wait(self.client.get_async(path), "read " + path)
        return data.decode().rsplit("|", 1)[0]

    def watch_procs(self, job_id, on_lost):
        """Call `on_lost(text)` once (in kazoo's thread) when a registered process of the job
        goes away without having ended normally (`proc_done`): killed, or its host lost."""
        job = job_path(job_id)
        seen, fired = {}, False

        def changed(children):
            nonlocal fired
            if fired:
                return False
            for name in children:
                if name not in seen:
                    try:
                        seen[name] = self.client.get(f"{job}/proc/{name}")[0].decode(errors="replace")
                    except (NoNodeError, KazooException):
                        seen[name] = "?"
            for name in set(seen) - set(children):
                value = seen.pop(name)
                try:
                    done = self.client.exists(f"{job}/proc-done/{name}") is not None
                except KazooException:
                    done = False
                if not done:
                    fired = True
                    host, _, pid = value.rpartition("|")
                    on_lost(f"process {name.removeprefix('proc-')} of job {job_id} "
                            f"({host or '?'}, pid {pid}) was lost")
                    return False
            return True

        self.client.ChildrenWatch(f"{job}/proc", changed)

    def proc_done(self, job_id, procs_id):
        """Mark process `procs_id` as ended normally (before its session closes): on the way
        out, so ClusterError at once when not connected and within SHUTDOWN_TIMEOUT otherwise."""
        if not self.client.connected:
            raise ClusterError(f"ZooKeeper at {self.hosts} is not connected (mark process done)")
        try:
            self._wait(self.client.create_async(f"{job_path(job_id)}/proc-done/proc-{procs_id}",
                                                makepath=True), "mark process done",
                       SHUTDOWN_TIMEOUT)
        except NodeExistsError:
            pass

    # --- worker / server group membership ---

    def join_sgroup(self, job_id, gid, wid, sgroup):
        """Worker (gid, wid) joins server group `sgroup` (ephemeral node)."""
        group = self._sgroup(job_id, sgroup)
        self._ensure(group)
        self._wait(self.client.create_async(f"{group}/g{gid}_w{wid}", ephemeral=True), "join server group")

    def leave_sgroup(self, job_id, gid, wid, sgroup):
        """Worker (gid, wid) leaves server group `sgroup`: on the way out, so ClusterError at
        once when the session is not connected and within SHUTDOWN_TIMEOUT otherwise."""
        if not self.client.connected:
            raise ClusterError(f"ZooKeeper at {self.hosts} is not connected (leave server group)")
        try:
            self._wait(self.client.delete_async(f"{self._sgroup(job_id, sgroup)}/g{gid}_w{wid}"),
                       "leave server group", SHUTDOWN_TIMEOUT)
        except NoNodeError:
            pass

    def watch_sgroup(self, job_id, sgroup, on_empty):
        """Call `on_empty()` once (in kazoo's thread) when server group `sgroup` has no worker left.

        Fires only after a worker has joined: a member seen, or a change event (a worker that
        joined and left between two reads), followed by an empty child list.
        """
        group = self._sgroup(job_id, sgroup)
        self._ensure(group)
        joined = False

        def changed(children, event):
            nonlocal joined
            if children:
                joined = True
            elif joined or event is not None:
                on_empty()
                return False    # stop watching
            return True

        self.client.ChildrenWatch(group, changed, send_event=True)

    # --- job listing (singatool list / view / remove / removeall / cleanup) ---

    def list_jobs(self, all=False):
        """[(job id, number of registered processes)] sorted by id; with all=False only running
        jobs. Jobs without processes are deleted once more than KEEP_IDLE_JOBS newer jobs exist."""
        names = sorted(self._children(APP))
        jobs = []
        for i, name in enumerate(names):
            try:
                nprocs = len(self._children(f"{APP}/{name}/proc"))
            except NoNodeError:
                nprocs = 0
            if nprocs == 0 and len(names) - 1 - i > KEEP_IDLE_JOBS:
                self._delete_tree(f"{APP}/{name}")
                continue
            if nprocs or all:
                jobs.append((int(name[len("job-"):]), nprocs))
        return jobs

    def job_procs(self, job_id):
        """["host|pid"] of the job's registered processes, by procs id (the ":port" is cut)."""
        procs = self._job_children(job_id)
        out = []
        for name in sorted(procs, key=lambda n: int(n[len("proc-"):])):
            try:
                data, _ = self._wait(self.client.get_async(f"{job_path(job_id)}/proc/{name}"), "read " + name)
            except NoNodeError:     # the process ended while we listed
                continue
            endpoint, pid = data.decode().rsplit("|", 1)
            out.append(f"{endpoint.rsplit(':', 1)[0]}|{pid}")
        return out

    def remove_job(self, job_id):
        """Delete the job's proc nodes (its processes count as gone)."""
        for name in self._job_children(job_id):
            self._delete_tree(f"{job_path(job_id)}/proc/{name}")

    def remove_all(self):
        """Delete every job under /singa/app (job ids keep increasing)."""
        for name in self._children(APP):
            self._delete_tree(f"{APP}/{name}")

    def cleanup(self):
        """Delete /singa entirely (job ids start again from 0)."""
        self._delete_tree(ROOT)

    # --- helpers ---

    def _sgroup(self, job_id, sgroup):
        return f"{job_path(job_id)}/group/sg{sgroup}"

    def _ensure_job(self, job_id):
        for sub in ("proc", "proc-lock", "group", "proc-done"):
            self._ensure(f"{job_path(job_id)}/{sub}")

    def _ensure(self, path, value=b""):
        """Create a persistent node (and its parents); an existing node counts as success."""
        try:
            self._wait(self.client.create_async(path, value, makepath=True), "create " + path)
        except NodeExistsError:
            pass

    def _children(self, path):
        return self._wait(self.client.get_children_async(path), "list " + path)

    def _job_children(self, job_id):
        try:
            return self._children(job_path(job_id) + "/proc")
        except NoNodeError:
            raise ClusterError(f"job {job_id} does not exist in ZooKeeper at {self.hosts}") from None

    def _delete_tree(self, path):
        try:
            for child in self._children(path):
                self._delete_tree(f"{path}/{child}")
            self._wait(self.client.delete_async(path), "delete " + path)
        except NoNodeError:     # gone already (an ephemeral node whose process ended)
            pass

    def _wait(self, result, what, timeout=None):
        """The value of a kazoo async call within `timeout` (default self.timeout) seconds;
        ZooKeeper's own errors (NoNode, NodeExists, BadVersion) pass through, lost connections
        and timeouts become ClusterError."""
        timeout = self.timeout if timeout is None else timeout
        try:
            return result.get(timeout=timeout)
        except (NoNodeError, NodeExistsError, BadVersionError):
            raise
        except KazooTimeoutError:
            raise ClusterError(f"ZooKeeper at {self.hosts} did not answer within "
                               f"{timeout:g} s ({what})") from None
        except KazooException as e:
            raise ClusterError(f"ZooKeeper at {self.hosts} failed ({what}): {type(e).__name__}") from None


def read_hostfile(path):
    """Hosts of a hostfile: first field of each line, skipping empty and '#' lines."""
    try:
        with open(path) as f:
            hosts = [line.split()[0] for line in f if line.strip() and not line.lstrip().startswith("#")]
    except OSError as e:
        raise ConfigError(f"{path}: cannot read hostfile ({e.strerror})") from None
    if not hosts:
        raise ConfigError(f"{path}: no hosts listed")
    return hosts


def _connect(hosts, timeout):
    """A started KazooClient, or ClusterError within `timeout` seconds."""
    _probe(hosts, timeout)
    client = KazooClient(hosts=hosts, timeout=SESSION_TIMEOUT,
                         connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1})
    try:
        client.start(timeout=timeout)
    except (KazooTimeoutError, KazooException) as e:    # start() has stopped the client already
        raise ClusterError(f"cannot reach ZooKeeper at {hosts} within {timeout:g} s") from e
    return client


def _probe(hosts, timeout):
    """Fail at once when no host of `hosts` accepts TCP (kazoo would retry until `timeout`)."""
    reasons = []
    for host, port in _addresses(hosts):
        try:
            socket.create_connection((host, port), timeout=min(timeout, 5)).close()
            return
        except socket.gaierror:
            reasons.append(f"unknown host {host}")
        except OSError as e:
            reasons.append(f"{host}:{port} {e.strerror or 'timed out'}")
    raise ClusterError(f"cannot reach ZooKeeper at {hosts} within {timeout:g} s ({'; '.join(reasons)})")


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
