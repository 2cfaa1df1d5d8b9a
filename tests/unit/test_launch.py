"""singa.cluster.launch: how many processes a job puts on its busiest host, and the refusal above
PROCS_PER_CORE per core."""
import os

import pytest

import singa
from singa.cluster import launch
from singa.errors import ConfigError
from singa.job import config


@pytest.mark.parametrize("hosts, nprocs, busiest", [
    (["a"], 5, ("a", 5)),
    (["a", "b"], 5, ("a", 3)),
    (["a", "b", "c"], 2, ("a", 1)),
    (["a", "a", "b"], 4, ("a", 3)),     # from the second line: a a b a, or a b a a
    (["b", "a", "a"], 3, ("a", 2)),
])
def test_busiest_host_over_every_round_robin_start(hosts, nprocs, busiest):
    assert launch.busiest_host(hosts, nprocs) == busiest


def test_busiest_host_bounds_every_start_of_the_round_robin():
    hosts = ["a", "b", "a", "c", "a", "b"]
    for nprocs in range(1, 20):
        host, most = launch.busiest_host(hosts, nprocs)
        counts = [sum(hosts[(s + i) % len(hosts)] == host for i in range(nprocs))
                  for s in range(len(hosts))]
        assert most == max(counts)


def test_more_than_four_processes_per_core_are_refused_unless_asked_for():
    launch.check_hosts(8, ["localhost"], cores=2)       # 4 per core: fine
    with pytest.raises(ConfigError) as e:
        launch.check_hosts(9, ["localhost"], cores=2)
    assert str(e.value) == (
        "cluster: the job's 9 processes put 9 on host localhost, which has 2 cores: more than "
        "4 per core; pass -oversubscribe to singa-run.sh to run it anyway")
    launch.check_hosts(9, ["h1", "h2", "h3"], cores=1)  # 3 on each


def test_oversubscribe_reads_no_hostfile(tmp_path):
    """-oversubscribe allows any load, so the hosts are not read: a conf folder without a
    hostfile (Slurm's: bin/singa-sbatch.sh passes it) passes; else its absence is one line."""
    path = os.path.join(singa.HOME, "tests", "fixtures", "singa-0.3", "job.conf")
    job = config.load_job(path, check_paths=False)
    for layer in job.neuralnet.layer:
        layer.store_conf.path = singa.resolve(layer.store_conf.path)
    hostfile = tmp_path / "hostfile"
    launch.check(job, path, str(hostfile), oversubscribe=True)
    with pytest.raises(ConfigError, match=f"^{hostfile}: cannot read hostfile "):
        launch.check(job, path, str(hostfile))
