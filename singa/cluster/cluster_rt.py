"""The cluster runtime a job's processes coordinate through (SINGA's ClusterRuntime and
SPClusterRT, src/utils/cluster_rt.cc): process ids and endpoints, server-group membership and
liveness. `ZKClusterRuntime` keeps them in ZooKeeper (the znodes of `singa.cluster.zk`);
`SPClusterRuntime` keeps them in this process, for a one-process job without ZooKeeper.

The runtime's watches call back in a thread of their own (kazoo's, or the leaving worker's).
"""
import logging
import threading
import time

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from singa.cluster.job_manager import parse_proc
from singa.cluster.zk import SESSION_TIMEOUT, SHUTDOWN_TIMEOUT, job_path
from singa.errors import ClusterError

log = logging.getLogger("singa")

#: the proc-done mark of a process that stopped on an error: `failed: <why>`, at most
#: MAX_REASON bytes
FAILED, MAX_REASON = b"failed: ", 500


def failed_mark(why):
    """The proc-done mark naming `why` a process stopped (see FAILED)."""
    return (FAILED + str(why).encode(errors="replace"))[:MAX_REASON].decode(errors="ignore")


def lost_text(job_id, procs_id, where, mark=None):
    """The report of process `procs_id` of job `job_id` gone (`where`: "host:port, pid N")
    without a normal end: its proc-done `mark` (bytes) names why, None: it was lost."""
    if mark is None:
        how = "was lost"
    elif mark.startswith(FAILED):
        how = mark[:MAX_REASON].decode(errors="replace")
    else:
        how = f"was stopped by {mark[:20].decode('ascii', 'replace')}"
    return f"process {procs_id} of job {job_id} ({where}) {how}"


class ClusterRuntime:
    """What a job's process asks of its cluster runtime; `job_id` names the job."""

    job_id = -1
    #: this registration of the process, larger for each restart of a procs id in the job (set
    #: by `register_proc`): a late message of an earlier one is told from it
    incarnation = 0

    def reserve_proc(self, procs_id=None):
        """This process's procs id in the job (before it has an endpoint): `procs_id` when
        given."""
        raise NotImplementedError

    def register_proc(self, endpoint, pid, procs_id=None, rejoin=False):
        """Register this process (its stub's `endpoint`, OS `pid`) as `procs_id` (None:
        reserved now; `rejoin`: a restart of that process in a running job); returns its
        procs id."""
        raise NotImplementedError

    def proc_endpoint(self, procs_id, timeout=None):
        """The endpoint of process `procs_id`, waiting up to `timeout` s for it to register."""
        raise NotImplementedError

    def known_endpoints(self):
        """{procs id: "host:port"} of the processes this one has learned the endpoints of
        (those it has asked `proc_endpoint` for), without asking anyone: what a time-out
        names when ZooKeeper cannot tell."""
        return {}

    def forget(self, procs_id):
        """Drop what was learned of process `procs_id` (it restarts elsewhere)."""

    def mark_lost(self, procs_id, endpoint):
        """Say that process `procs_id` at `endpoint` is taken for lost (an elastic process the
        others now run without): `watch_procs` tells that process, should it still run (a
        freeze shorter than its ZooKeeper session). Does not wait; a failure is a warning."""

    def proc_address(self, procs_id):
        """"host:port, pid N" of process `procs_id`, as learned by `proc_endpoint`."""
        return "?"

    def proc_mark(self, procs_id):
        """The proc-done mark of process `procs_id` (bytes; see `proc_done`), None when it has
        none or the runtime cannot tell now (within a second)."""
        return None

    def watch_procs(self, on_lost, on_joined=None):
        """Call `on_lost(text, procs id)` when a process of the job goes away without
        `proc_done` (procs id None: this process's own registration ended, or the others took
        it for lost: `mark_lost`), `on_joined(procs id)` when it comes back."""
        raise NotImplementedError

    def proc_done(self, procs_id, stopped_by=""):
        """Mark process `procs_id` as ended (before it leaves): normally, or `stopped_by` a
        signal (its name), which the others take for a failure."""
        raise NotImplementedError

    def join_sgroup(self, gid, wid, sgroup):
        """Worker (gid, wid) joins server group `sgroup`."""
        raise NotImplementedError

    def leave_sgroup(self, gid, wid, sgroup):
        """Worker (gid, wid) leaves server group `sgroup`; on the way out, so a failure is a
        warning."""
        raise NotImplementedError

    def watch_sgroup(self, sgroup, on_empty):
        """Call `on_empty()` once when server group `sgroup` has had workers and has none left."""
        raise NotImplementedError

    def close(self):
        """Leave the runtime (ZooKeeper ends this process's ephemeral nodes)."""

    @property
    def connected(self):
        """Whether the runtime can tell this process about the others (ZooKeeper reachable)."""
        return True


class SPClusterRuntime(ClusterRuntime):
    """The runtime of a job that runs whole in this process: no ZooKeeper, no other process
    (SINGA's SPClusterRT, SINGA-155)."""

    def __init__(self, job_id=-1):
        self.job_id = job_id
        self.endpoint = None
        self.lock = threading.Lock()
        self.members = {}       # sgroup -> {(gid, wid)}
        self.watches = {}       # sgroup -> on_empty

    def reserve_proc(self, procs_id=None):
        return 0

    def register_proc(self, endpoint, pid, procs_id=None, rejoin=False):
        self.endpoint = endpoint
        return 0

    def proc_endpoint(self, procs_id, timeout=None):
        if procs_id != 0 or self.endpoint is None:
            raise ClusterError(f"job {self.job_id} runs in one process; there is no process "
                               f"{procs_id}")
        return self.endpoint

    def watch_procs(self, on_lost, on_joined=None):
        pass    # no other process to lose

    def proc_done(self, procs_id, stopped_by=""):
        pass

    def join_sgroup(self, gid, wid, sgroup):
        with self.lock:
            self.members.setdefault(sgroup, set()).add((gid, wid))

    def leave_sgroup(self, gid, wid, sgroup):
        with self.lock:
            members = self.members.get(sgroup, set())
            members.discard((gid, wid))
            fire = self.watches.pop(sgroup, None) if not members else None
        if fire is not None:
            fire()

    def watch_sgroup(self, sgroup, on_empty):
        with self.lock:
            self.watches[sgroup] = on_empty


class ZKClusterRuntime(ClusterRuntime):
    """Job `job_id`'s runtime in ZooKeeper, over the session `zk` (a `singa.cluster.zk.ZKService`).
    With a `trust` (`singa.comm.trust.JobTrust`, the session authenticated with it) the job's nodes
    carry its ACL, and a job node made without it is refused."""

    def __init__(self, zk, job_id, trust=None):
        self.zk, self.job_id, self.trust = zk, job_id, trust
        self.path = job_path(job_id)
        self.acl = trust.zk_acl if trust is not None else None
        self.procs_id = None    # once registered
        self.endpoint = None    # this process's, once registered
        self.endpoints = {}     # procs id -> "host:port", as read (fixed for the job's run)
        self.os_pids = {}       # procs id -> its OS pid, as read

    def reserve_proc(self, procs_id=None):
        """The rank of this process's proc-lock node is its procs id, unless given."""
        zk, job = self.zk, self.path
        zk.ensure(job, acl=self.acl)
        if self.trust is not None:
            acl, _ = zk.wait(zk.client.get_acls_async(job), "read the ACL of " + job)
            if not self.trust.owns(acl):
                raise ClusterError(f"job {self.job_id}: its node {job} in ZooKeeper at "
                                   f"{zk.hosts} was not made with this job's secret: not "
                                   f"joining it")
        for sub in ("proc", "proc-lock", "group", "proc-done", "proc-lost"):
            zk.ensure(f"{job}/{sub}", acl=self.acl)
        if procs_id is not None:
            return procs_id
        lock = zk.wait(zk.client.create_async(job + "/proc-lock/lock-", ephemeral=True,
                                              sequence=True, acl=self.acl), "create proc lock")
        locks = sorted(zk.children(job + "/proc-lock"))
        return locks.index(lock.rsplit("/", 1)[1])

    def register_proc(self, endpoint, pid, procs_id=None, rejoin=False):
        """`rejoin`: `procs_id` comes back to a running job (a restart of a lost process,
        issue 31): its old proc-done and proc-lost marks go, and its old proc node, which
        ZooKeeper ends with the lost session, is waited for (SESSION_TIMEOUT and a margin)."""
        zk, job = self.zk, self.path
        if procs_id is None:
            procs_id = self.reserve_proc()
        node = f"{job}/proc/proc-{procs_id}"
        if rejoin:
            for mark in ("proc-done", "proc-lost"):
                try:
                    zk.wait(zk.client.delete_async(f"{job}/{mark}/proc-{procs_id}"),
                            f"delete the old {mark} mark")
                except NoNodeError:
                    pass
            deadline = time.monotonic() + SESSION_TIMEOUT + 5
            while zk.wait(zk.client.exists_async(node), "stat " + node) and \
                    time.monotonic() < deadline:
                time.sleep(0.2)
        try:
            _, stat = zk.wait(zk.client.create_async(node, f"{endpoint}|{pid}".encode(),
                                                     ephemeral=True, acl=self.acl,
                                                     include_data=True), "create proc node")
        except NodeExistsError:
            raise ClusterError(f"procs id {procs_id} of job {self.job_id} is already registered "
                               f"in ZooKeeper at {zk.hosts}") from None
        self.procs_id, self.endpoint = procs_id, endpoint
        self.incarnation = stat.czxid   # ZooKeeper's transaction ids only grow
        return procs_id

    def proc_endpoint(self, procs_id, timeout=None):
        """Read once: a process registers its endpoint once per run, and a time-out later
        names it from here when ZooKeeper is away."""
        if procs_id in self.endpoints:
            return self.endpoints[procs_id]
        zk = self.zk
        path = f"{self.path}/proc/proc-{procs_id}"
        timeout = zk.timeout if timeout is None else timeout
        registered = threading.Event()
        if not zk.wait(zk.client.exists_async(path, watch=lambda event: registered.set()),
                       "stat " + path):
            if not registered.wait(timeout):
                raise ClusterError(f"process {procs_id} of job {self.job_id} did not register in "
                                   f"ZooKeeper at {zk.hosts} within {timeout:g} s")
        data, _ = zk.wait(zk.client.get_async(path), "read " + path)
        proc = parse_proc(data)
        if proc is None:
            raise ClusterError(f"{path} in ZooKeeper at {zk.hosts} holds {bytes(data)[:40]!r}, "
                               f"not <host>:<port>|<pid>")
        self.endpoints[procs_id] = f"{proc[0]}:{proc[1]}"
        self.os_pids[procs_id] = proc[2]
        return self.endpoints[procs_id]

    def known_endpoints(self):
        return dict(self.endpoints)

    def forget(self, procs_id):
        """Drop the endpoint learned of `procs_id` (it restarted elsewhere)."""
        self.endpoints.pop(procs_id, None)
        self.os_pids.pop(procs_id, None)

    def mark_lost(self, procs_id, endpoint):
        zk, node = self.zk, f"{self.path}/proc-lost/proc-{procs_id}"

        def written(result):
            try:
                result.get()
            except NodeExistsError:     # an earlier incarnation's, or another reporter's
                zk.client.set_async(node, endpoint.encode())
            except KazooException as e:
                log.warning("could not mark process %s lost in ZooKeeper: %s", procs_id, e)
        zk.client.create_async(node, endpoint.encode(), acl=self.acl).rawlink(written)

    def proc_address(self, procs_id):
        return f"{self.endpoints.get(procs_id, '?')}, pid {self.os_pids.get(procs_id, '?')}"

    def proc_mark(self, procs_id):
        zk = self.zk
        if not zk.connected:
            return None
        try:
            return zk.wait(zk.client.get_async(f"{self.path}/proc-done/proc-{procs_id}"),
                           "read a proc-done mark", 1.0)[0]
        except (NoNodeError, ClusterError):
            return None

    def watch_procs(self, on_lost, on_joined=None):
        """In kazoo's thread: `on_lost(text, procs id)` each time a proc node ends without a
        proc-done mark "" (the mark, a signal's name or `failed: <why>`, is in the text);
        `on_joined(procs id)` when a proc node seen to end comes back (a restart); our own
        session's expiry, or the others' `mark_lost` of this process, is reported once, with
        procs id None."""
        client, job = self.zk.client, self.path
        seen, gone, own = {}, set(), False

        def changed(children):
            nonlocal own
            for name in children:
                if name not in seen:
                    try:
                        seen[name] = client.get(f"{job}/proc/{name}")[0].decode(errors="replace")
                    except (NoNodeError, KazooException):
                        seen[name] = "?"
                    if name in gone and on_joined is not None:
                        gone.discard(name)
                        procs_id = name.removeprefix("proc-")
                        if procs_id.isdigit():
                            on_joined(int(procs_id))
            for name in set(seen) - set(children):
                value = seen.pop(name)
                try:
                    mark = client.get(f"{job}/proc-done/{name}")[0]
                except (NoNodeError, KazooException):
                    mark = None
                if mark == b"":
                    continue
                gone.add(name)
                host, _, pid = value.rpartition("|")
                if name == f"proc-{self.procs_id}":     # our own session expired
                    if not own:
                        own = True
                        on_lost(f"this process ({name.removeprefix('proc-')} of job "
                                f"{self.job_id}) lost its ZooKeeper session at {self.zk.hosts}: "
                                f"the others take it for lost", None)
                    continue
                procs_id = name.removeprefix("proc-")
                on_lost(lost_text(self.job_id, procs_id, f"{host or '?'}, pid {pid}", mark),
                        int(procs_id) if procs_id.isdigit() else None)
            return True

        def taken_for_lost(data, stat):
            nonlocal own
            if data is not None and data.decode(errors="replace") == self.endpoint and not own:
                own = True
                on_lost(f"this process ({self.procs_id} of job {self.job_id}) was taken for "
                        f"lost by the others (frozen, or cut off, for a while): it stops, to "
                        f"restart and rejoin", None)

        client.ChildrenWatch(f"{job}/proc", changed)
        if self.procs_id is not None:
            client.DataWatch(f"{job}/proc-lost/proc-{self.procs_id}", taken_for_lost)

    def proc_done(self, procs_id, stopped_by=""):
        """On the way out: ClusterError at once when not connected, within SHUTDOWN_TIMEOUT
        otherwise. The mark holds the signal's name, or `failed: <why>` (`failed_mark`) for a
        process that stopped on an error, which the others then name."""
        zk = self.zk
        if not zk.connected:
            raise ClusterError(f"ZooKeeper at {zk.hosts} is not connected (mark process done)")
        try:
            zk.wait(zk.client.create_async(f"{self.path}/proc-done/proc-{procs_id}",
                                           stopped_by.encode(), acl=self.acl, makepath=True),
                    "mark process done", SHUTDOWN_TIMEOUT)
        except NodeExistsError:
            pass

    def join_sgroup(self, gid, wid, sgroup):
        group = self._sgroup(sgroup)
        self.zk.ensure(group, acl=self.acl)
        self.zk.wait(self.zk.client.create_async(f"{group}/g{gid}_w{wid}", ephemeral=True,
                                                 acl=self.acl), "join server group")

    def leave_sgroup(self, gid, wid, sgroup):
        """A lost session is a warning: the node ends with it."""
        zk = self.zk
        try:
            if not zk.connected:
                raise ClusterError(f"ZooKeeper at {zk.hosts} is not connected (leave server group)")
            zk.wait(zk.client.delete_async(f"{self._sgroup(sgroup)}/g{gid}_w{wid}"),
                    "leave server group", SHUTDOWN_TIMEOUT)
        except NoNodeError:
            pass
        except ClusterError as e:
            log.warning("Worker (group = %d, id = %d) did not leave its server group: %s",
                        gid, wid, e)

    def watch_sgroup(self, sgroup, on_empty):
        """Fires only after a worker has joined: a member seen, or a change event (a worker
        that joined and left between two reads), followed by an empty child list."""
        group = self._sgroup(sgroup)
        self.zk.ensure(group, acl=self.acl)
        joined = False

        def changed(children, event):
            nonlocal joined
            if children:
                joined = True
            elif joined or event is not None:
                on_empty()
                return False    # stop watching
            return True

        self.zk.client.ChildrenWatch(group, changed, send_event=True)

    @property
    def connected(self):
        return self.zk.connected

    def close(self):
        """Leave the job: this process's proc node goes now (with no proc-done mark the others
        see it lost at once); the last process to leave deletes the job's inner nodes, which
        only the job's secret may, so the job stays listed without processes and `singatool
        removeall` can delete it. On the way out: failures are warnings."""
        zk = self.zk
        if self.procs_id is None or not zk.connected:
            return
        try:
            zk.wait(zk.client.delete_async(f"{self.path}/proc/proc-{self.procs_id}"),
                    "delete proc node", SHUTDOWN_TIMEOUT)
            self.procs_id = None
            if not zk.wait(zk.client.get_children_async(f"{self.path}/proc"), "list procs",
                           SHUTDOWN_TIMEOUT):
                for sub in zk.children(self.path):
                    zk.delete_tree(f"{self.path}/{sub}")
        except NoNodeError:
            pass
        except ClusterError as e:
            log.warning("process left job %d in ZooKeeper untidily: %s", self.job_id, e)

    def _sgroup(self, sgroup):
        return f"{self.path}/group/sg{sgroup}"
