"""What `singa -check` checks before singa-run.sh starts a job's processes: the net builds from
the conf, no host gets more processes than it can sensibly run, and this one has the GPUs its
processes take."""
import copy
import os
import socket
from collections import Counter

import numpy as np

from singa.cluster.job_manager import read_hostfile
from singa.device import CPU
from singa.device.footprint import SHAPES, BeyondMemory
from singa.errors import ConfigError, SingaError
from singa.job import config, topology
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2

PROCS_PER_CORE = 4      # more processes of one job per core than this are refused


def check(job, path, hostfile, test=False, oversubscribe=False):
    """Build the net a worker of the job at `path` builds (train, or test for -test) and
    check the hosts' load and this host's GPUs (`check_gpus`), unless `oversubscribe` allows
    any load: then `hostfile` is not read (bin/singa-sbatch.sh, and singa-run.sh inside a
    Slurm allocation, pass it: Slurm places the processes, and the conf folder may have no
    hostfile)."""
    build(job, test)
    if not oversubscribe:
        hosts = read_hostfile(hostfile)
        check_hosts(topology.nprocs(job.cluster), hosts, len(os.sched_getaffinity(0)))
        check_gpus(job, path, hosts)


def build(job, test=False, device=CPU):
    """The net a worker of `job` builds, on `device`: the kTest net for -test (`test`), else
    the kTrain net over nworkers_per_group partitions."""
    rng = np.random.default_rng(0)
    if test:
        return NeuralNet(job.neuralnet, job_pb2.kTest, rng, device=device)
    return NeuralNet(job.neuralnet, job_pb2.kTrain, rng, None, job.cluster.nworkers_per_group,
                     device=device)


def check_memory(job, what):
    """ConfigError "<what>: ..." naming the param or layer if the net `build` makes of `job`
    would allocate an array larger than this machine's memory (`singa.device.footprint`'s rule, per
    array), learnt by setting the net up on SHAPES: nothing is allocated and nothing is
    written. Mean and std files, which hold values and no shapes, are not read (an importer
    writes its mean file after this check); other mistakes, such as a data store not yet
    written, are left to the build that runs the net."""
    job = copy.deepcopy(job)
    for layer in job.neuralnet.layer:
        if layer.HasField("store_conf"):
            layer.store_conf.ClearField("mean_file")
            layer.store_conf.ClearField("std_file")
        if layer.HasField("rgbimage_conf"):
            layer.rgbimage_conf.ClearField("meanfile")
    try:
        build(job, device=SHAPES)
    except BeyondMemory as e:
        raise ConfigError(f"{what}: {e}") from None
    except SingaError:
        pass


def check_hosts(nprocs, hosts, cores):
    """ConfigError when `nprocs` processes, given round-robin to `hosts` (the hostfile's lines,
    from any line on), may put more than PROCS_PER_CORE × `cores` on one host."""
    host, most = busiest_host(hosts, nprocs)
    if most > PROCS_PER_CORE * cores:
        raise ConfigError(f"cluster: the job's {nprocs} processes put {most} on host {host}, "
                          f"which has {cores} cores: more than {PROCS_PER_CORE} per core; pass "
                          f"-oversubscribe to singa-run.sh to run it anyway")


def check_gpus(job, path, hosts):
    """ConfigError at the `gpu` line of the conf at `path` when the most processes of `job`
    that the round-robin over `hosts` puts on a name of this machine (`busiest_host`) take
    more GPUs than it has (`singa.device.of_process`); none when the conf names no GPU."""
    here = {"localhost", "127.0.0.1", socket.gethostname()}
    if job.gpu and here.intersection(hosts):
        host, most = busiest_host(hosts, topology.nprocs(job.cluster), among=here)
        config.check_host_gpus(path, job, most, host)


def busiest_host(hosts, nprocs, among=None):
    """(host, most processes it gets) over every start line of the round-robin (host-idx):
    full turns of the hostfile, then the best of the windows of the remaining processes;
    `among`: of these hosts only."""
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
    return max(((h, turns * count[h] + most[h]) for h in most if among is None or h in among),
               key=lambda x: x[1])
