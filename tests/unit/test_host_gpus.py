"""Several processes of a job on one host take GPUs of their own: the conf's `gpu` ids shifted
by the process's rank on its host (`device.of_process`), the rank from bin/singa-run.sh's
-host_rank or Slurm's SLURM_LOCALID, and `singa -check` refusing a host with too few GPUs."""
import logging
import os
import re
import subprocess
import sys

import pytest

import singa
from singa import device, driver
from singa.cluster.cluster_rt import SPClusterRuntime
from singa.errors import ConfigError
from singa.job import config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import strict_device     # noqa: E402

FIXTURE = os.path.join(singa.HOME, "tests", "fixtures", "singa-0.3", "job.conf")


@pytest.mark.parametrize("ids, rank, taken", [
    ([0], 0, [0]),
    ([0], 1, [1]),
    ([0], 3, [3]),
    ([0, 1], 1, [2, 3]),
    ([0, 1], 2, [4, 5]),
    ([1], 1, [3]),              # the shift is max + 1: process 0 keeps GPU 0 free, so does 1
    ([0, 0], 1, [1, 1]),        # two workers sharing a GPU share the next one
    ([2, 0], 1, [5, 3]),        # the workers' order is kept
    ([], 2, []),                # no GPU: the CPU, whatever the rank
])
def test_a_process_takes_the_ids_shifted_by_its_rank_on_its_host(ids, rank, taken):
    assert device.of_process(ids, rank) == taken


def test_host_rank_is_a_flag_a_number():
    flags = driver.parse_flags(["-conf", "j.conf", "-host_rank", "2"])
    assert flags["host_rank"] == 2
    assert "host_rank" not in driver.parse_flags(["-conf", "j.conf"])
    with pytest.raises(ConfigError) as e:
        driver.parse_flags(["-conf", "j.conf", "-host_rank", "one"])
    assert str(e.value).startswith("-host_rank one: not a rank on the host; usage: singa ")
    assert "\n" not in str(e.value) and "[-host_rank N]" in str(e.value)


@pytest.mark.parametrize("flag, host, env, rank", [
    (None, None, {}, 0),                                        # by hand, the Python API
    (2, None, {}, 2),                                           # bin/singa-run.sh's
    (None, "auto", {"SLURM_JOB_ID": "7", "SLURM_LOCALID": "3"}, 3),
    (None, "auto", {"SLURM_JOB_ID": "7", "SLURM_LOCALID": "3", "SLURM_GPUS_PER_TASK": "1"}, 0),
    (None, "auto", {"SLURM_LOCALID": "3"}, 0),                  # not in a Slurm job
    (None, "node1", {"SLURM_JOB_ID": "7", "SLURM_LOCALID": "3"}, 0),    # not a Slurm task
    (1, "auto", {"SLURM_JOB_ID": "7", "SLURM_LOCALID": "3"}, 1),        # the flag first
])
def test_host_rank_from_the_flag_or_slurm(monkeypatch, flag, host, env, rank):
    for name in ("SLURM_JOB_ID", "SLURM_LOCALID", "SLURM_GPUS_PER_TASK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert driver.host_rank(flag, host, os.environ) == rank


def test_a_bad_slurm_localid_is_one_line():
    with pytest.raises(ConfigError, match=r"^SLURM_LOCALID=x: not a task's rank on its node$"):
        driver.host_rank(None, "auto", {"SLURM_JOB_ID": "7", "SLURM_LOCALID": "x"})


def write_job(tmp_path, nprocs, gpu="gpu: 0\n"):
    """(path, line of `gpu`) of the fixture MLP as a job of `nprocs` one-group processes."""
    with open(FIXTURE) as f:
        text = f.read()
    cluster = re.search(r"^cluster \{.*\}$", text, re.M)[0]
    text = text.replace(cluster, f'cluster {{ nworker_groups: {nprocs} nworkers_per_procs: 1 '
                                 f'workspace: "{tmp_path / "ws"}" }}')
    (tmp_path / "ws").mkdir(exist_ok=True)
    path = tmp_path / "job.conf"
    path.write_text(text + gpu)
    return str(path), text.count("\n") + 1


def check(tmp_path, hosts, capsys):
    """(exit code, stderr lines) of `singa -check` with a hostfile of `hosts`."""
    (tmp_path / "conf").mkdir(exist_ok=True)
    (tmp_path / "conf" / "hostfile").write_text("".join(h + "\n" for h in hosts))
    (tmp_path / "conf" / "singa.conf").write_text('zookeeper_host: "localhost:1"\n')
    capsys.readouterr()
    rc = driver.main(["-conf", str(tmp_path / "job.conf"), "-singa_conf",
                      str(tmp_path / "conf" / "singa.conf"), "-check"])
    return rc, capsys.readouterr().err.splitlines()


def test_check_refuses_more_processes_here_than_gpus_naming_the_gpu_line(tmp_path, monkeypatch,
                                                                          capsys):
    strict_device.installed(monkeypatch, gpus=2)
    path, line = write_job(tmp_path, 3)
    assert check(tmp_path, ["localhost"], capsys) == (2, [
        f"singa: {path}:{line}: gpu: [0] for the 3 processes the hostfile puts on localhost "
        f"(host rank r takes each id + r × 1): 2 is not a GPU of this machine: it has 2 (ids 0 "
        f"to 1); or delete the gpu lines to train on the CPU"])
    write_job(tmp_path, 2)
    assert check(tmp_path, ["localhost"], capsys) == (0, [])
    write_job(tmp_path, 3)       # localhost gets 2 of the 3 at most, node1 the other
    assert check(tmp_path, ["localhost", "node1"], capsys) == (0, [])
    assert check(tmp_path, ["node1", "node2", "node3"], capsys) == (0, [])     # none here
    assert check(tmp_path, ["node1"] * 3 + ["localhost"], capsys) == (0, [])   # 1 here
    monkeypatch.setattr(device, "cupy", lambda: pytest.fail("CuPy asked for"))
    write_job(tmp_path, 3, gpu="")      # a CPU job: no CuPy
    assert check(tmp_path, ["localhost"], capsys) == (0, [])


def test_a_process_whose_host_lacks_its_gpus_fails_alone_at_its_start(tmp_path, monkeypatch,
                                                                       capsys):
    strict_device.installed(monkeypatch, gpus=2)
    path, line = write_job(tmp_path, 3)
    rc = driver.main(["-conf", path, "-host_rank", "2"])
    assert rc == 2
    assert capsys.readouterr().err.splitlines() == [
        f"singa: {path}:{line}: gpu: [0] at host rank 2 (host rank r takes each id + r × 1): "
        f"2 is not a GPU of this machine: it has 2 (ids 0 to 1); or delete the gpu lines to "
        f"train on the CPU"]


def test_the_driver_of_host_rank_1_computes_on_gpu_1(tmp_path, monkeypatch, caplog):
    strict_device.installed(monkeypatch, gpus=2)
    path, _ = write_job(tmp_path, 3)
    job = config.load_job(path, host_rank=1)
    assert list(job.gpu) == [0]         # the conf's ids, those of rank 1 checked
    d = driver.Driver(job, SPClusterRuntime(), host_rank=1)
    assert list(d.job.gpu) == [1]
    assert device.of_workers(d.job.gpu, [0])[0].gpu == 1    # runtime.Process's and evaluation's
    with caplog.at_level(logging.INFO, "singa"):
        d.log_gpus(1)
    assert caplog.messages == ["process 1 takes GPU 1 (host rank 1 of gpu: [0])"]
    two = driver.Driver(config.load_job(write_job(tmp_path, 3, "gpu: 0\ngpu: 1\n")[0]),
                        SPClusterRuntime(), host_rank=1)
    assert list(two.job.gpu) == [2, 3]


def test_singa_run_ranks_the_processes_of_each_host_in_job_hosts(tmp_path):
    """bin/singa-run.sh's host_rank over job.hosts: blank lines name no process."""
    with open(os.path.join(singa.HOME, "bin", "singa-run.sh")) as f:
        func = re.search(r"^host_rank\(\) \{\n.*?^\}\n", f.read(), re.M | re.S)[0]
    hosts = tmp_path / "job.hosts"
    hosts.write_text("a\nb\n\na\na slots=2\nc\n")
    ranks = subprocess.run(["bash", "-c", func + 'for i in 0 1 2 3 4; do host_rank "$1" $i; done',
                            "bash", str(hosts)], capture_output=True, text=True, check=True)
    assert ranks.stdout.split() == ["0", "0", "1", "2", "0"]
