"""Topology math from a ClusterProto (pure functions; SINGA's src/utils/cluster.cc)."""
import math

#: the most processes a job may run: a conf that claims more is refused before anything is
#: made for each process (hosts, elastic_procs)
MAX_PROCS = 1 << 16


def nworker_procs(cluster):
    return cluster.nworker_groups * cluster.nworkers_per_group // cluster.nworkers_per_procs


def nserver_procs(cluster):
    return cluster.nserver_groups * cluster.nservers_per_group // cluster.nservers_per_procs


def nprocs(cluster):
    """Number of OS processes of a job.

    nworker_procs = nworker_groups * nworkers_per_group / nworkers_per_procs
    nserver_procs = nserver_groups * nservers_per_group / nservers_per_procs
    nprocs = nworker_procs + nserver_procs if server_worker_separate
             else max(nworker_procs, nserver_procs)
    (integer division, as in SINGA)
    """
    if cluster.server_worker_separate:
        return nworker_procs(cluster) + nserver_procs(cluster)
    return max(nworker_procs(cluster), nserver_procs(cluster))


def worker_procs(cluster, grp, id_):
    """The process of worker (grp, id): (grp * nworkers_per_group + id) / nworkers_per_procs."""
    return (grp * cluster.nworkers_per_group + id_) // cluster.nworkers_per_procs


def server_procs(cluster, grp, id_):
    """The process of server (grp, id): (grp * nservers_per_group + id) / nservers_per_procs,
    after the worker processes when server_worker_separate."""
    offset = nworker_procs(cluster) if cluster.server_worker_separate else 0
    return (grp * cluster.nservers_per_group + id_) // cluster.nservers_per_procs + offset


def executor_range(pid, grp_size, per_procs):
    """SINGA's ExecutorRng: (gstart, gend, start, end) of the executors of process `pid`:
    groups [gstart, gend), ids [start, end) in each."""
    if grp_size >= per_procs:
        gstart = pid * per_procs // grp_size
        start = pid * per_procs % grp_size
        return gstart, gstart + 1, start, start + per_procs
    k = per_procs // grp_size
    return pid * k, (pid + 1) * k, 0, grp_size


def workers_of(cluster, pid):
    """[(grp, id)] of the workers process `pid` runs."""
    if pid >= nworker_procs(cluster):
        return []
    g0, g1, j0, j1 = executor_range(pid, cluster.nworkers_per_group, cluster.nworkers_per_procs)
    return [(g, j) for g in range(g0, g1) for j in range(j0, j1)]


def servers_of(cluster, pid):
    """[(grp, id)] of the servers process `pid` runs."""
    if cluster.server_worker_separate:
        pid -= nworker_procs(cluster)
    if not 0 <= pid < nserver_procs(cluster):
        return []
    g0, g1, j0, j1 = executor_range(pid, cluster.nservers_per_group, cluster.nservers_per_procs)
    return [(g, j) for g in range(g0, g1) for j in range(j0, j1)]


def nworker_groups_per_server_group(cluster):
    """nworker_groups / nserver_groups (1 when there is no server group or it is 0)."""
    per = cluster.nworker_groups // cluster.nserver_groups if cluster.nserver_groups else 1
    return max(1, per)


def server_group(cluster, worker_grp):
    """The server group worker group `worker_grp` talks to."""
    return worker_grp // nworker_groups_per_server_group(cluster)


def elastic_procs(cluster, max_restarts):
    """The processes whose loss an asynchronous job rides out (issue 31): with several worker
    groups (Downpour, Hogwild) and `max_restarts` (the job's: none, nothing restarts them), a
    process that holds whole worker groups and no server; its groups leave their server group
    and join again when it restarts."""
    if max_restarts < 1 or cluster.nworker_groups < 2 or \
            cluster.nworkers_per_group > cluster.nworkers_per_procs:
        return set()
    return {pid for pid in range(nworker_procs(cluster)) if not servers_of(cluster, pid)}


def check_layout(cluster):
    """The ConfigError SINGA's ExecutorRng would hit, or None: a process holds either part of
    one group or whole groups, and every executor has a process."""
    for kind, n, size, per in (("worker", cluster.nworker_groups, cluster.nworkers_per_group,
                                cluster.nworkers_per_procs),
                               ("server", cluster.nserver_groups, cluster.nservers_per_group,
                                cluster.nservers_per_procs)):
        if per < 1:
            return f"cluster: n{kind}s_per_procs {per} must be at least 1"
        if size >= per and size % per:
            return (f"cluster: n{kind}s_per_group {size} is not a multiple of "
                    f"n{kind}s_per_procs {per}")
        if size < per and (per % size or (n * size) % per):
            return (f"cluster: n{kind}s_per_procs {per} must be a multiple of n{kind}s_per_group "
                    f"{size} that divides the {n * size} {kind}s")
    n = nprocs(cluster)
    return f"cluster: {n} processes, more than the {MAX_PROCS} a job may run" \
        if n > MAX_PROCS else None


def slice_sizes(num, sizes):
    """SINGA's Slice(num, sizes): cut params into pieces that fill `num` boxes evenly.

    avg = total/num + total%num, diff = avg/10; a param goes whole into the current box if it
    fits (or overflows it by at most diff, closing it); else the box's remaining capacity is cut
    off (if at least diff) and a new box starts. Returns, per param, its piece sizes.
    """
    total = sum(sizes)
    avg = total // num + total % num
    diff = avg // 10
    capacity = avg
    out = []
    for x in sizes:
        pieces = []
        while x > 0:
            if capacity >= x:
                pieces.append(x)
                capacity -= x
                x = 0
            elif capacity + diff >= x:
                pieces.append(x)
                capacity = 0
                x = 0
            elif capacity >= diff:
                pieces.append(capacity)
                x -= capacity
                capacity = avg
            else:
                capacity = avg
        out.append(pieces)
    return out


def partition_slices(num, slices):
    """SINGA's PartitionSlices: box id of each slice, consecutive slices filling `num` boxes."""
    if num == 1:
        return [0] * len(slices)
    total = sum(slices)
    avg = total // num + total % num
    diff = avg // 10
    box, boxid, out = avg, 0, []
    i = 0
    while i < len(slices):
        x = slices[i]
        if box >= x:
            box -= x
        elif box + diff >= x:
            box = 0
        else:
            box = avg
            boxid += 1
            continue
        out.append(boxid)
        i += 1
    return out


def lcm(a, b):
    return a * b // math.gcd(a, b)
