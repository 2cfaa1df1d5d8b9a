"""Jobs in ZooKeeper as `singatool` sees them (SINGA's JobManager, src/utils/cluster_rt.cc):
new job ids, the hosts of a job's processes, listing, removal and cleanup."""
import logging
import re
import time

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from singa.cluster.zk import APP, HOST_IDX, JOB_LOCK, ROOT, job_path
from singa.errors import ClusterError, ConfigError

log = logging.getLogger("singa")

KEEP_IDLE_JOBS = 10        # jobs without processes are deleted once more newer jobs than this exist
JOB_NAME = re.compile(r"job-(\d{10})")     # a job's node under /singa/app (zk.job_path)


class JobManager:
    """Job ids, hosts and the job list over the session `zk` (a `singa.cluster.zk.ZKService`)."""

    def __init__(self, zk):
        self.zk = zk

    def new_job_id(self, trust=None):
        """A new job id: the sequence number of a fresh /singa/sys/job-lock/lock- node. With
        a `trust` (`singa.comm.trust.JobTrust`) the job's node is made here with its ACL. An id
        whose node exists already (made by another client, or a job that a cleanup left) is
        passed over."""
        zk = self.zk
        while True:
            try:
                path = zk.wait(zk.client.create_async(JOB_LOCK + "/lock-", ephemeral=True,
                                                      sequence=True), "create job lock")
            except NoNodeError:
                raise _deleted(zk, JOB_LOCK) from None
            job_id = int(path[-10:])
            if trust is None:       # ids restart after a cleanup: pass over a job left there
                if zk.wait(zk.client.exists_async(job_path(job_id)), "look up the job's node"):
                    continue
                return job_id
            try:
                zk.wait(zk.client.create_async(job_path(job_id), acl=trust.zk_acl),
                        "create the job's node")
                return job_id
            except NodeExistsError:
                continue
            except NoNodeError:
                raise _deleted(zk, APP) from None

    def gen_hosts(self, hostfile, nprocs):
        """`nprocs` hosts from `hostfile`, round-robin from host-idx, which moves on by nprocs."""
        zk = self.zk
        hosts = read_hostfile(hostfile)
        while True:
            try:
                data, stat = zk.wait(zk.client.get_async(HOST_IDX), "read host-idx")
                start = parse_index(data)
                zk.wait(zk.client.set_async(HOST_IDX, str((start + nprocs) % len(hosts)).encode(),
                                            version=stat.version), "write host-idx")
                break
            except BadVersionError:     # another job took hosts meanwhile; read again
                continue
            except NoNodeError:
                raise _deleted(zk, HOST_IDX) from None
        return [hosts[(start + i) % len(hosts)] for i in range(nprocs)]

    def list_jobs(self, all=False):
        """[(job id, number of registered processes)] sorted by id; with all=False only running
        jobs. Jobs without processes are deleted once more than KEEP_IDLE_JOBS newer jobs exist.
        Other nodes under /singa/app (anyone may create them) are passed over."""
        try:
            names = sorted(n for n in self.zk.children(APP) if JOB_NAME.fullmatch(n))
        except NoNodeError:     # /singa deleted meanwhile (singatool cleanup)
            return []
        jobs = []
        for i, name in enumerate(names):
            try:
                nprocs = len(self.zk.children(f"{APP}/{name}/proc"))
            except NoNodeError:
                nprocs = 0
            if nprocs == 0 and len(names) - 1 - i > KEEP_IDLE_JOBS:
                self.zk.delete_tree(f"{APP}/{name}")
                continue
            if nprocs or all:
                jobs.append((int(name[len("job-"):]), nprocs))
        return jobs

    def job_procs(self, job_id):
        """["host|pid"] of the job's registered processes, by procs id (the ":port" is cut)."""
        zk = self.zk
        out = []
        for name in sorted(self._procs(job_id), key=lambda n: (len(n), n)):
            try:
                data, _ = zk.wait(zk.client.get_async(f"{job_path(job_id)}/proc/{name}"),
                                  "read " + name)
            except NoNodeError:     # the process ended while we listed
                continue
            proc = parse_proc(data)
            if proc is None:
                log.warning("%s/proc/%s holds %r, not <host>:<port>|<pid>: skipped",
                            job_path(job_id), name, data[:40])
                continue
            out.append(f"{proc[0]}|{proc[2]}")
        return out

    def proc_state(self, job_id, procs_id):
        """Where process `procs_id` of job `job_id` stands in ZooKeeper: "running host|pid"
        (its node is there), "done" (ended normally: proc-done mark ""), "stopped" (a
        signal's or a failure's mark), "lost" (neither), or "over" (the job has no process
        left: its last one deleted the marks)."""
        zk, path = self.zk, job_path(job_id)

        def read(node):
            try:
                return zk.wait(zk.client.get_async(node), "read " + node)[0]
            except NoNodeError:
                return None
        data = read(f"{path}/proc/proc-{procs_id}")
        if data is not None:
            proc = parse_proc(data)
            return "running" + (f" {proc[0]}|{proc[2]}" if proc else "")
        mark = read(f"{path}/proc-done/proc-{procs_id}")
        if mark is not None:
            return "done" if mark == b"" else "stopped"
        return "lost" if self._procs(job_id) else "over"

    def wait_ended(self, job_id, poll=0.5, given_up=lambda: False):
        """True once job `job_id` has had processes and has none left: every one of them
        ended or was lost (its session expired). A ZooKeeper outage is ridden through: the
        session reconnects by itself (a new one once the old has expired) and the wait goes on;
        the caller bounds it by the job's own end (bin/singa-run.sh ends it with the job), since
        only ZooKeeper can say the job is over. False as soon as `given_up()` is true (asked
        every `poll` seconds)."""
        proc, seen, down = job_path(job_id) + "/proc", False, False
        while not given_up():
            try:
                children = self.zk.children(proc)
            except NoNodeError:     # not made yet, or deleted by the last process to leave
                children = []
            except ClusterError as e:      # ZooKeeper away, or our session lost: ask again
                if not down:
                    log.warning("%s: still waiting for job %d", e, job_id)
                down = True
                time.sleep(poll)
                continue
            down = False
            seen = seen or bool(children)
            if seen and not children:
                return True
            time.sleep(poll)
        return False

    def remove_job(self, job_id):
        """Delete the job's proc nodes (its processes count as gone); returns the nodes left,
        as `remove_all`."""
        left = []
        for name in self._procs(job_id):
            left += self.zk.delete_tree(f"{job_path(job_id)}/proc/{name}")
        return left

    def remove_all(self):
        """Delete every job under /singa/app (job ids keep increasing); returns the nodes left
        because they belong to a job whose secret we do not hold."""
        left = []
        for name in self.zk.children(APP):
            left += self.zk.delete_tree(f"{APP}/{name}")
        return left

    def cleanup(self):
        """Delete /singa entirely (job ids start again from 0); returns the nodes left, as
        `remove_all`."""
        return self.zk.delete_tree(ROOT)

    def _procs(self, job_id):
        """Names of the job's proc nodes ([] for a job all of whose processes have left)."""
        try:
            return self.zk.children(job_path(job_id) + "/proc")
        except NoNodeError:
            if self.zk.wait(self.zk.client.exists_async(job_path(job_id)), "stat the job"):
                return []
            raise ClusterError(f"job {job_id} does not exist in ZooKeeper at "
                               f"{self.zk.hosts}") from None


def _deleted(zk, path):
    """The error of a shared node deleted under a launch (a `singatool cleanup` meanwhile, or
    a stranger: anyone may delete it)."""
    return ClusterError(f"{path} in ZooKeeper at {zk.hosts} was deleted during the launch "
                        f"(by singatool cleanup?); launch again")


def parse_index(data):
    """The host index in /singa/sys/host-idx: anything but a small number counts as 0 (the
    node is shared by every job, and anyone may write it)."""
    text = bytes(data or b"0")[:12].decode("ascii", "replace")
    if not text.isdigit():
        log.warning("%s holds %r, not a number: hosts are taken from the first", HOST_IDX,
                    bytes(data)[:40])
        return 0
    return int(text)


def parse_proc(data):
    """(host, port, pid) of a proc node's "<host>:<port>|<pid>", or None when malformed."""
    m = re.fullmatch(r"([^|:\s]+):(\d{1,5})\|(\d{1,10})", bytes(data or b"")[:300]
                     .decode("ascii", "replace"))
    return (m[1], int(m[2]), int(m[3])) if m else None


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
