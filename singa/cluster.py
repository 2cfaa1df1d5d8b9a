"""Topology math from a ClusterProto (pure functions; SINGA's src/utils/cluster.cc)."""
import math


def nprocs(cluster):
    """Number of OS processes of a job.

    nworker_procs = nworker_groups * nworkers_per_group / nworkers_per_procs
    nserver_procs = nserver_groups * nservers_per_group / nservers_per_procs
    nprocs = nworker_procs + nserver_procs if server_worker_separate
             else max(nworker_procs, nserver_procs)
    (integer division, as in SINGA)
    """
    nworker_procs = cluster.nworker_groups * cluster.nworkers_per_group // cluster.nworkers_per_procs
    nserver_procs = cluster.nserver_groups * cluster.nservers_per_group // cluster.nservers_per_procs
    if cluster.server_worker_separate:
        return nworker_procs + nserver_procs
    return max(nworker_procs, nserver_procs)


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
