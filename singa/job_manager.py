"""Jobs in ZooKeeper as `singatool` sees them (SINGA's JobManager, src/utils/cluster_rt.cc):
new job ids, the hosts of a job's processes, listing, removal and cleanup."""
from kazoo.exceptions import BadVersionError, NoNodeError

from singa.errors import ClusterError, ConfigError
from singa.zk import APP, HOST_IDX, JOB_LOCK, ROOT, job_path

KEEP_IDLE_JOBS = 10        # jobs without processes are deleted once more newer jobs than this exist


class JobManager:
    """Job ids, hosts and the job list over the session `zk` (a `singa.zk.ZKService`)."""

    def __init__(self, zk):
        self.zk = zk

    def new_job_id(self):
        """A new job id: the sequence number of a fresh /singa/sys/job-lock/lock- node."""
        zk = self.zk
        path = zk.wait(zk.client.create_async(JOB_LOCK + "/lock-", ephemeral=True, sequence=True),
                       "create job lock")
        return int(path[-10:])

    def gen_hosts(self, hostfile, nprocs):
        """`nprocs` hosts from `hostfile`, round-robin from host-idx, which moves on by nprocs."""
        zk = self.zk
        hosts = read_hostfile(hostfile)
        while True:
            data, stat = zk.wait(zk.client.get_async(HOST_IDX), "read host-idx")
            start = int(data or b"0")
            try:
                zk.wait(zk.client.set_async(HOST_IDX, str((start + nprocs) % len(hosts)).encode(),
                                            version=stat.version), "write host-idx")
                break
            except BadVersionError:     # another job took hosts meanwhile; read again
                continue
        return [hosts[(start + i) % len(hosts)] for i in range(nprocs)]

    def list_jobs(self, all=False):
        """[(job id, number of registered processes)] sorted by id; with all=False only running
        jobs. Jobs without processes are deleted once more than KEEP_IDLE_JOBS newer jobs exist."""
        names = sorted(self.zk.children(APP))
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
        for name in sorted(self._procs(job_id), key=lambda n: int(n[len("proc-"):])):
            try:
                data, _ = zk.wait(zk.client.get_async(f"{job_path(job_id)}/proc/{name}"), "read " + name)
            except NoNodeError:     # the process ended while we listed
                continue
            endpoint, pid = data.decode().rsplit("|", 1)
            out.append(f"{endpoint.rsplit(':', 1)[0]}|{pid}")
        return out

    def remove_job(self, job_id):
        """Delete the job's proc nodes (its processes count as gone)."""
        for name in self._procs(job_id):
            self.zk.delete_tree(f"{job_path(job_id)}/proc/{name}")

    def remove_all(self):
        """Delete every job under /singa/app (job ids keep increasing)."""
        for name in self.zk.children(APP):
            self.zk.delete_tree(f"{APP}/{name}")

    def cleanup(self):
        """Delete /singa entirely (job ids start again from 0)."""
        self.zk.delete_tree(ROOT)

    def _procs(self, job_id):
        try:
            return self.zk.children(job_path(job_id) + "/proc")
        except NoNodeError:
            raise ClusterError(f"job {job_id} does not exist in ZooKeeper at {self.zk.hosts}") from None


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
