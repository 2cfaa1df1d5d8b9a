"""Place: where a process stands in its job, the one description a `runtime.Process` and its
workers are built from, whether the job runs in one process or in several."""
import dataclasses

from singa.errors import SingaError


@dataclasses.dataclass(frozen=True)
class Place:
    """Process `pid` of the `nprocs` processes of a job (`Place()`: a job's only process).

    One of several reaches the others' stubs at `endpoint(pid[, timeout])`, "host:port" (the
    cluster runtime's `proc_endpoint`), through its `transport` (`runtime.Transport`,
    listening on tcp; made before the process registers, which gives it its pid; None: one
    made by the Process). Its workers join and leave their server groups in `cluster_rt` (the
    job's `singa.cluster.cluster_rt.ClusterRuntime`, or None). `rejoin`: this process is the
    restart of one the job rode out the loss of (an elastic process), and its worker groups
    Get the servers' params instead of putting their own; its stub waits `rejoin_timeout` s
    for the restart of such a process that is lost.
    """
    pid: int = 0
    nprocs: int = 1
    endpoint: object = None
    transport: object = None
    cluster_rt: object = None
    rejoin: bool = False
    rejoin_timeout: float = 60.0

    @property
    def alone(self):
        """Whether the job runs in this process only."""
        return self.nprocs == 1

    def where(self, pid):
        """'process P at host:port': the endpoint this process learned at start-up (the cluster
        runtime keeps it), so a time-out names it with ZooKeeper away too."""
        if self.cluster_rt is None or self.alone:
            return f"process {pid} at this process"
        try:
            endpoint = self.cluster_rt.proc_endpoint(pid, timeout=1)
        except SingaError as e:
            endpoint = f"an endpoint this process never learned ({e})"
        return f"process {pid} at {endpoint}"
