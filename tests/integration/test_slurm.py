"""Slurm: a real one-node cluster (munged, slurmctld, slurmd started here with a private key,
socket, state and ports); bin/singa-sbatch.sh submits, SIGUSR1 before a time limit snapshots,
requeues and resumes, a wrong task count is one line."""
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

import singa
from conftest import free_port
from singa.checkpoint import CheckpointReader

BIN = os.path.join(singa.HOME, "bin")
DAEMONS = ("munged", "slurmctld", "slurmd")


def sh(*cmd, env=None, check=True, timeout=60):
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=check,
                          timeout=timeout)


class Cluster:
    """munged + slurmctld + slurmd of one node (this machine, 8 CPUs declared), partition main;
    `env` has SLURM_CONF (set before any Slurm command: without it the client asks DNS)."""

    def __init__(self, root):
        self.root, self.pids = root, []
        (root / "munge").mkdir(mode=0o700)
        (root / "state").mkdir()
        (root / "spool").mkdir()
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.socket = root / "munge" / "munge.socket"
        sh("munged", f"--key-file={key}", f"--socket={self.socket}", "--force",
           f"--pid-file={root}/munge/munged.pid", f"--log-file={root}/munge/munged.log",
           f"--seed-file={root}/munge/seed")
        host = sh("hostname").stdout.strip()
        conf = root / "slurm.conf"
        conf.write_text(f"""ClusterName=singatest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={self.socket},cred_expire=10
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
NodeName={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=main Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
        self.env = dict(os.environ, SLURM_CONF=str(conf))
        sh("slurmctld", "-f", str(conf), env=self.env)
        sh("slurmd", "-f", str(conf), env=self.env)
        deadline = time.monotonic() + 30
        while "idle" not in sh("sinfo", "-h", "-o", "%t", env=self.env, check=False).stdout:
            assert time.monotonic() < deadline, (root / "slurmctld.log").read_text()[-2000:]
            time.sleep(0.5)

    def state(self, job):
        out = sh("scontrol", "show", "job", str(job), env=self.env, check=False).stdout
        m = re.search(r"JobState=(\w+)", out)
        return m[1] if m else "GONE", out

    def close(self):
        for name, pidfile in (("slurmd", "slurmd.pid"), ("slurmctld", "slurmctld.pid"),
                              ("munged", "munge/munged.pid")):
            try:
                os.kill(int((self.root / pidfile).read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)}): thirdparty/install.sh "
                    f"--tests installs slurmctld slurmd munge")
    if os.geteuid() != 0:
        pytest.skip("the test cluster's daemons run as root")
    cluster = Cluster(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.close()


@pytest.fixture
def slurm_env(slurm, singa_conf, tmp_path):
    env = {k: v for k, v in slurm.env.items() if not k.startswith("SINGA_")}
    env.update(SINGA_CONF=str(singa_conf.parent), SINGA_LOG=str(tmp_path / "log"))
    return env


def sandblaster(fixture_job, name, tmp_path, steps):
    return fixture_job(f"{name}.conf", workspace=tmp_path / name, head="seed: 7\n", edits={
        "cluster { nworker_groups: 1 nserver_groups: 1":
            "cluster { nworker_groups: 1 nserver_groups: 1 nworkers_per_group: 2 "
            "server_worker_separate: true",
        "train_steps: 200": f"train_steps: {steps}", "test_freq: 100": "test_freq: 0",
        "checkpoint_freq: 100": "checkpoint_freq: 1000"})


def submit(conf, env, out, *opts):
    r = sh(os.path.join(BIN, "singa-sbatch.sh"), "-conf", str(conf), f"--output={out}",
           "--open-mode=append", *opts, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return int(re.search(r"Submitted batch job (\d+)", r.stdout)[1])


def wait_state(slurm, job, states, timeout=120):
    deadline = time.monotonic() + timeout
    while (state := slurm.state(job))[0] not in states:
        assert time.monotonic() < deadline, state[1]
        time.sleep(0.5)
    return state[0]


def test_sbatch_usr1_snapshots_requeues_and_resumes_exactly(slurm, slurm_env, fixture_job,
                                                             tmp_path):
    """SIGUSR1 to the batch script (what --signal=B:USR1@T sends before the time limit): the
    job snapshots at the step reached, requeues itself, and the next run resumes from there to
    the end, with the params of an uninterrupted run."""
    steps = 3000
    whole = submit(sandblaster(fixture_job, "whole", tmp_path, steps), slurm_env,
                   tmp_path / "whole.out")
    assert wait_state(slurm, whole, {"COMPLETED", "FAILED"}) == "COMPLETED", \
        (tmp_path / "whole.out").read_text()[-3000:]
    out = tmp_path / "signalled.out"
    job = submit(sandblaster(fixture_job, "signalled", tmp_path, steps), slurm_env, out)
    deadline = time.monotonic() + 120
    while len(re.findall(r"Train @ step", out.read_text() if out.exists() else "")) < 50:
        assert time.monotonic() < deadline and slurm.state(job)[0] in ("PENDING", "RUNNING")
        time.sleep(0.3)
    signalled = time.monotonic()
    sh("scancel", "--batch", "--signal=USR1", str(job), env=slurm_env)
    snapped = tmp_path / "signalled" / "checkpoint"
    while not re.search(r"stopping at step \d+ after a snapshot", out.read_text()):
        assert time.monotonic() < signalled + 60, out.read_text()[-3000:]
        time.sleep(0.1)
    assert wait_state(slurm, job, {"COMPLETED", "FAILED"}, timeout=300) == "COMPLETED", \
        out.read_text()[-3000:]
    text = out.read_text()
    step = int(re.search(r"stopping at step (\d+) after a snapshot", text)[1])
    assert "requeued" in text and re.search(rf"Resume from step {step}\b", text), text[-3000:]
    assert 0 < step < steps and step % 1000          # the step reached, not a checkpoint_freq one
    for w in (0, 1):
        assert (snapped / f"step{step}-worker{w}.bin").is_file()
        final = f"step{steps}-worker{w}.bin"
        ours = CheckpointReader(str(snapped / final))
        ref = CheckpointReader(str(tmp_path / "whole" / "checkpoint" / final))
        for name in ref.names:
            np.testing.assert_array_equal(ours.param(name), ref.param(name), err_msg=name)


def test_a_conf_whose_process_count_differs_from_the_allocation_is_one_line(slurm, slurm_env,
                                                                            fixture_job,
                                                                            tmp_path):
    conf = sandblaster(fixture_job, "mismatch", tmp_path, 10)        # 3 processes
    r = sh("salloc", "-n", "2", os.path.join(BIN, "singa-run.sh"), "-conf", str(conf),
           env=slurm_env, check=False, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert re.search(rf"^singa-run: {re.escape(str(conf))} runs 3 processes but Slurm job \d+ "
                     r"has 2 tasks \(--ntasks=3; bin/singa-sbatch.sh works it out\)$",
                     r.stderr, re.M), r.stderr
