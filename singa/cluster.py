"""Topology math from a ClusterProto (pure functions; SINGA's src/utils/cluster.cc)."""


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
