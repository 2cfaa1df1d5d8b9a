"""What `singa -check` checks before singa-run.sh starts a job's processes: the net builds from
the conf, and no host gets more processes than it can sensibly run."""
import os
from collections import Counter

import numpy as np

from singa import cluster
from singa.errors import ConfigError
from singa.neuralnet import NeuralNet
from singa.proto import job_pb2
from singa.job_manager import read_hostfile

PROCS_PER_CORE = 4      # more processes of one job per core than this are refused


def check(job, hostfile, test=False, oversubscribe=False):
    """Build the net a worker builds (train, or test for -test) and check the hosts' load,
    unless `oversubscribe` allows any: then `hostfile` is not read (bin/singa-sbatch.sh, and
    singa-run.sh inside a Slurm allocation, pass it: Slurm places the processes, and the conf
    folder may have no hostfile)."""
    cl = job.cluster
    if test:
        NeuralNet(job.neuralnet, job_pb2.kTest, np.random.default_rng(0))
    else:
        NeuralNet(job.neuralnet, job_pb2.kTrain, np.random.default_rng(0), None,
                  cl.nworkers_per_group)
    if not oversubscribe:
        check_hosts(cluster.nprocs(cl), read_hostfile(hostfile), len(os.sched_getaffinity(0)))


def check_hosts(nprocs, hosts, cores):
    """ConfigError when `nprocs` processes, given round-robin to `hosts` (the hostfile's lines,
    from any line on), may put more than PROCS_PER_CORE × `cores` on one host."""
    host, most = busiest_host(hosts, nprocs)
    if most > PROCS_PER_CORE * cores:
        raise ConfigError(f"cluster: the job's {nprocs} processes put {most} on host {host}, "
                          f"which has {cores} cores: more than {PROCS_PER_CORE} per core; pass "
                          f"-oversubscribe to singa-run.sh to run it anyway")


def busiest_host(hosts, nprocs):
    """(host, most processes it gets) over every start line of the round-robin (host-idx):
    full turns of the hostfile, then the best of the windows of the remaining processes."""
    n = len(hosts)
    turns, rest = divmod(nprocs, n)
    window = Counter(hosts[:rest])
    most = {h: window[h] for h in Counter(hosts)}      # the hostfile's order breaks ties
    for s in range(1, n if rest else 0):     # slide the window of `rest` lines one line on
        window[hosts[s - 1]] -= 1
        h = hosts[(s - 1 + rest) % n]
        window[h] += 1
        most[h] = max(most[h], window[h])
    count = Counter(hosts)
    return max(((h, turns * count[h] + most[h]) for h in most), key=lambda x: x[1])
