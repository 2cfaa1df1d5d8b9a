"""Jobs across processes: real `singa` processes on this machine, real ZooKeeper, real tcp;
and asynchronous worker groups resumed in one `runtime.Process`, whose servers a test reads."""
import os
import re
import signal
import subprocess
import tempfile
import time

import numpy as np
import pytest
import zmq

from conftest import PYTHON, asynchronous_accuracy, new_job, start_drivers
from singa.checkpoint import CheckpointReader
from singa.cluster.cluster_rt import ZKClusterRuntime
from singa.cluster.zk import ZKService
from singa.job.config import parse_job
from singa.train.runtime import Process, resume_from, slice_table

# SINGA's frameworks scaled to this machine (docs/distributed.md), each in several processes
LAYOUTS = {
    "sandblaster": "nworkers_per_group: 2 nservers_per_group: 1 server_worker_separate: true",
    "allreduce": "nworkers_per_group: 2 nservers_per_group: 2",
}
ONE_PROCESS = "nworkers_per_group: 2 nworkers_per_procs: 2 nservers_per_group: 1"


def job_text(fixture_job, tmp_path, name, layout, steps=60):
    return fixture_job(name + ".conf", workspace=tmp_path / name, edits={
        "cluster { nworker_groups: 1 nserver_groups: 1":
            f"cluster {{ nworker_groups: 1 nserver_groups: 1 {layout}",
        "train_steps: 200": f"train_steps: {steps}", "test_freq: 100": "test_freq: 30",
        "checkpoint_freq: 100": "checkpoint_freq: 30", "disp_freq: 20": "disp_freq: 10"},
        head="seed: 7\n")


def run_job(conf, singa_conf, zk_server, nprocs, timeout=240, flags=()):
    """Start `nprocs` drivers of one job id; returns [(returncode, log)] in start order. Logs
    go to files: a pipe nobody reads while another process is awaited fills up and blocks its
    writer, which stalls the whole job."""
    job_id, env, _ = new_job(zk_server)
    with tempfile.TemporaryDirectory() as folder:
        logs = [os.path.join(folder, f"proc{i}.log") for i in range(nprocs)]
        procs = start_drivers(conf, singa_conf, job_id, env, logs, flags)
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.wait(timeout=max(1, deadline - time.monotonic()))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        return [(p.returncode, open(log).read()) for p, log in zip(procs, logs)]


def losses(log):
    return [float(x) for x in re.findall(r"Train @ step \d+  Loss = ([\d.]+)", log)]


@pytest.mark.parametrize("framework", sorted(LAYOUTS))
def test_synchronous_frameworks_in_processes_train_as_in_one(framework, fixture_job, singa_conf,
                                                              zk_server, tmp_path):
    one = run_job(job_text(fixture_job, tmp_path, "one", ONE_PROCESS), singa_conf, zk_server, 1)
    assert one[0][0] == 0, one[0][1]
    many = run_job(job_text(fixture_job, tmp_path, framework, LAYOUTS[framework]), singa_conf, zk_server,
                   3 if framework == "sandblaster" else 2)
    assert all(rc == 0 for rc, _ in many), "\n".join(log for _, log in many)
    logs = "\n".join(log for _, log in many)
    assert re.search(r"proc #\d -> 127\.0\.0\.1:\d+", logs)      # tcp on the host's address
    curve, expected = losses(logs), losses(one[0][1])
    assert len(curve) == len(expected) == 6 and curve[-1] < curve[0]
    np.testing.assert_allclose(curve, expected, rtol=1e-5)     # the same sums, in the same order
    for w in (0, 1):
        ours = CheckpointReader(str(tmp_path / framework / "checkpoint" / f"step60-worker{w}.bin"))
        ref = CheckpointReader(str(tmp_path / "one" / "checkpoint" / f"step60-worker{w}.bin"))
        assert ours.names == ref.names
        for name in ours.names:
            np.testing.assert_allclose(ours.param(name), ref.param(name), rtol=1e-5, atol=1e-6)


def survivor_of(sig, fixture_job, singa_conf, zk_server, tmp_path):
    """A 2-process AllReduce job, `sig` to one process once both train: (the victim's OS pid,
    the other's exit status and log, the job id). The victim is killed at the end."""
    conf = job_text(fixture_job, tmp_path, "victim", LAYOUTS["allreduce"], steps=100000)
    job_id, env, _ = new_job(zk_server)
    logs = [tmp_path / f"proc{i}.log" for i in range(2)]
    procs = start_drivers(conf, singa_conf, job_id, env, logs)
    try:
        deadline = time.monotonic() + 120
        while "Train @ step 20 " not in "".join(log.read_text() for log in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                "".join(log.read_text() for log in logs)
            time.sleep(0.2)
        victim, survivor = procs
        victim.send_signal(sig)
        rc = survivor.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return victim.pid, rc, logs[1].read_text(), job_id


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_killed_or_frozen_process_is_noticed_by_its_connection(sig, fixture_job, singa_conf,
                                                                 zk_server, tmp_path):
    """The other process stops with a line naming it, noticed by its dropped connection (a
    kill at once, a freeze by missed heartbeats), not by its ZooKeeper session's end, which
    logs no "No connection" line."""
    pid, rc, text, job_id = survivor_of(sig, fixture_job, singa_conf, zk_server, tmp_path)
    lost = re.search(rf"process (\d) of job {job_id} \(127\.0\.0\.1:(\d+), pid {pid}\) was "
                     rf"lost", text)
    assert rc != 0 and lost, text
    noticed = re.search(rf"No connection to process {lost[1]} at 127\.0\.0\.1:{lost[2]} for 1 s",
                        text)
    assert noticed and noticed.start() < lost.start(), text
    assert text.count(" was lost") == 2 and "Traceback" not in text    # the log's line, stderr's


GARBAGE = [
    [b"\x00\xff garbage"], [b""], [b"1 2"], [b"not numbers at all x"],
    [b"0 0 1 65536 0", b"*singa*\0"],                          # a Put of no values
    [b"0 0 3 0 0", b"*singa*\0i\x01\x00\x00\x00", b"abc"],       # an Update of 3 bytes
    [b"0 131074 3 0 0", b"*singa*\0i\x01\x00\x00\x00", np.ones(7, np.float32).tobytes()],
    [b"0 131074 9 0 5"],                                       # an answer nobody asked for
    [b"0 0 77 0 0", b"x"],                                     # an unknown type
]


def test_garbage_frames_from_a_peer_of_the_job_change_nothing(fixture_job, singa_conf,
                                                              zk_server, tmp_path):
    """Malformed frames from a peer holding the job's keys (a process of the job gone wrong)
    are dropped with a line; the job ends as an unattacked one."""
    clean = run_job(job_text(fixture_job, tmp_path, "clean", LAYOUTS["allreduce"]), singa_conf,
                    zk_server, 2)
    assert all(rc == 0 for rc, _ in clean)
    conf = job_text(fixture_job, tmp_path, "attacked", LAYOUTS["allreduce"])
    job_id, env, trust = new_job(zk_server)
    with ZKService(zk_server) as zk:
        procs = [subprocess.Popen([PYTHON, "-m", "singa.driver", "-conf", str(conf), "-singa_conf",
                                   str(singa_conf), "-singa_job", str(job_id)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for _ in range(2)]
        try:
            ctx = zmq.Context()
            for pid in range(2):
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 1000)
                sock.curve_serverkey = trust.server_public
                sock.curve_publickey, sock.curve_secretkey = trust.client_public, trust.client_secret
                sock.connect("tcp://" + ZKClusterRuntime(zk, job_id).proc_endpoint(pid, timeout=60))
                for frames in GARBAGE:
                    sock.send_multipart(frames)
                sock.close()
            ctx.term()
            outs = [p.communicate(timeout=240)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)
    assert "dropped" in "".join(outs) and "Traceback" not in "".join(outs)
    ours = CheckpointReader(str(tmp_path / "attacked" / "checkpoint" / "step60-worker0.bin"))
    ref = CheckpointReader(str(tmp_path / "clean" / "checkpoint" / "step60-worker0.bin"))
    for name in ref.names:
        np.testing.assert_array_equal(ours.param(name), ref.param(name))


# Asynchronous SGD computes each gradient on params a few updates old, which acts as extra
# momentum: with the fixture's momentum 0.9 the test accuracy of Downpour and Hogwild swings by
# 2-4 points between tests and ends 0.5-1.6 points below one worker's on average (6 seeds). With
# plain SGD at the same step size (lr 0.5 = 0.05 / (1 - 0.9)) both match one worker (measured
# over 6 seeds: one 0.775 +- 0.004, Downpour 0.781 +- 0.007, Hogwild 0.782 +- 0.005). On a
# loaded machine group 1 may lag when group 0 tests, and single tests swing further (CI once
# saw 0.758, 0.732, 0.758, 0.696 at steps 150-300 against one worker's 0.74-0.776): the median
# of the last three tests is held to the band of one worker (`asynchronous_accuracy`), within
# 3 points: a job that does not learn, or diverges, stays far below it.
PLAIN_SGD = {"momentum: 0.9 learning_rate { type: kFixed base_lr: 0.05 }":
             "learning_rate { type: kFixed base_lr: 0.5 }"}
ASYNCHRONOUS = {
    "downpour": ("nworker_groups: 2 nserver_groups: 1 server_worker_separate: true", 3),
    "hogwild": ("nworker_groups: 2 nserver_groups: 2 sync_freq: 2", 2),
    "hogwild in one process": ("nworker_groups: 2 nserver_groups: 2 sync_freq: 2 "
                               "nworkers_per_procs: 2 nservers_per_procs: 2", 1),
}


def plain_sgd_job(fixture_job, tmp_path, name, cluster, steps):
    return fixture_job(name.replace(" ", "-") + ".conf", workspace=tmp_path / name, edits={
        **PLAIN_SGD, "cluster { nworker_groups: 1 nserver_groups: 1": f"cluster {{ {cluster}",
        "train_steps: 200": f"train_steps: {steps}", "test_freq: 100": "test_freq: 50"},
        head="seed: 7\n")


@pytest.mark.parametrize("framework", sorted(ASYNCHRONOUS))
def test_asynchronous_frameworks_reach_the_accuracy_of_one_worker(framework, fixture_job,
                                                                   singa_conf, zk_server, tmp_path):
    """Two asynchronous worker groups (SINGA's Downpour: a server group of their own process;
    Distributed Hogwild: a server group each, in each group's process or all in one, synced
    every 2 updates): the median test accuracy of their steps 200-300 within 3 points of the
    band one worker spans from its step 200 to its step 600 (as many samples; see above)."""
    one = run_job(plain_sgd_job(fixture_job, tmp_path, "single", "nworker_groups: 1 "
                                "nserver_groups: 1", 601), singa_conf, zk_server, 1)
    cluster, nprocs = ASYNCHRONOUS[framework]
    many = run_job(plain_sgd_job(fixture_job, tmp_path, framework, cluster, 301), singa_conf,
                   zk_server, nprocs)
    assert one[0][0] == 0 and all(rc == 0 for rc, _ in many), "\n".join(log for _, log in many)
    logs = "".join(log for _, log in many)
    ours, band = asynchronous_accuracy(logs, one[0][1], (200, 250, 300))
    assert min(band) - 0.03 <= ours <= max(band) + 0.03, (ours, band)
    if framework.startswith("hogwild"):   # each server synced its other half with the master
        syncs = re.findall(r"Server \(group = (\d), id = 0\): (\d+) syncs with master servers, "
                           r"(\d+) as master", logs)
        assert sorted(g for g, _, _ in syncs) == ["0", "1"], logs
        assert all(int(sent) > 10 and int(answered) > 10 for _, sent, answered in syncs), syncs


def test_sandblaster_interrupted_and_resumed_ends_bit_identical(fixture_job, singa_conf,
                                                                zk_server, tmp_path):
    full = job_text(fixture_job, tmp_path, "full", LAYOUTS["sandblaster"])
    assert all(rc == 0 for rc, _ in run_job(full, singa_conf, zk_server, 3))
    folder = tmp_path / "full" / "checkpoint"
    resumed = tmp_path / "resumed" / "checkpoint"
    resumed.mkdir(parents=True)
    for w in (0, 1):     # as if every process was killed right after the snapshot of step 30
        for ext in (".bin", ".meta"):
            (resumed / f"step30-worker{w}{ext}").write_bytes(
                (folder / f"step30-worker{w}{ext}").read_bytes())
    conf = job_text(fixture_job, tmp_path, "resumed", LAYOUTS["sandblaster"])
    out = run_job(conf, singa_conf, zk_server, 3, flags=("-resume",))
    assert all(rc == 0 for rc, _ in out), "\n".join(log for _, log in out)
    assert "Resume from step 30" in out[0][1]
    for w in (0, 1):
        a = (folder / f"step60-worker{w}.bin").read_bytes()
        b = (resumed / f"step60-worker{w}.bin").read_bytes()
        assert a == b, f"worker {w}'s final snapshot differs"


FIXED_STEP = {"learning_rate { type: kFixed base_lr: 0.05 }":
              "learning_rate { type: kFixedStep fixedstep_conf { step: 0 step: 2 "
              "step_lr: 0.05 step_lr: 0.02 } }"}


@pytest.mark.parametrize("framework", ["hogwild", "downpour"])
def test_resume_in_one_process_gives_every_server_group_the_snapshots_updater_state(
        framework, fixture_job, tmp_path):
    """Two worker groups in one runtime.Process (Distributed Hogwild: a server group each;
    Downpour: one), SGD momentum 0.9 with a kFixedStep LR, trained 3 steps and resumed at its
    step-3 snapshot with nothing left to train: every server holds the snapshot's momentum
    history and LR index; group 0's reader stands where the snapshot left it, group 1's where
    a fresh start puts it."""
    servers = {"hogwild": "nserver_groups: 2 nservers_per_procs: 2 sync_freq: 2",
               "downpour": "nserver_groups: 1"}[framework]
    conf = fixture_job(edits={
        **FIXED_STEP, "train_steps: 200": "train_steps: 3", "test_steps: 5": "test_steps: 0",
        "checkpoint_freq: 100": "checkpoint_freq: 0",
        "cluster { nworker_groups: 1 nserver_groups: 1":
            f"cluster {{ nworker_groups: 2 nworkers_per_procs: 2 {servers}"}, head="seed: 7\n")
    folder = tmp_path / "ws" / "checkpoint"
    folder.mkdir(parents=True)
    Process(parse_job(conf.read_text(), str(conf))).run()
    snapshot = CheckpointReader(str(folder / "step3-worker0.bin")).snapshot_state()
    assert snapshot.lr_index == 1
    job = parse_job(conf.read_text(), str(conf))
    process = Process(job, resume=resume_from(job, str(folder)))
    process.run()
    owners = process.train_graph.owner_params
    table, _ = slice_table(job, owners)
    assert len(process.servers) == job.cluster.nserver_groups
    for server in process.servers:
        assert server.updater.lr_gen.get_index() == 1, server.grp
        for p in owners:
            history = snapshot.param_state[p.name][0].ravel()
            assert history.any(), p.name
            for sid, offset, size in table[p.id]:
                np.testing.assert_array_equal(server.slices[sid].buffers[0],
                                              history[offset:offset + size],
                                              err_msg=f"server group {server.grp}, {p.name}")
    readers = {w.grp: w.train_net.input_layers()[0] for w in process.workers}
    assert readers[0].position()[0] == snapshot.reader[f"train/{readers[0].name}"][0]
    assert readers[1].position()[0] == 0


def test_sigusr1_to_one_process_snapshots_every_worker_at_one_step_and_resume_is_exact(
        fixture_job, singa_conf, zk_server, tmp_path):
    """SIGUSR1 to one process of a Sandblaster job: every worker stops some 0.25 s of steps
    later, both writing their files of that step (a complete snapshot there, wherever the
    last checkpoint_freq step was), and the processes end; -resume from it ends with the
    params of an uninterrupted run."""
    whole = run_job(job_text(fixture_job, tmp_path, "whole", LAYOUTS["sandblaster"], steps=1200),
                    singa_conf, zk_server, 3)
    assert all(rc == 0 for rc, _ in whole), whole
    conf = job_text(fixture_job, tmp_path, "signalled", LAYOUTS["sandblaster"], steps=1200)
    job_id, env, _ = new_job(zk_server)
    logs = [tmp_path / f"usr1-{i}.log" for i in range(3)]
    procs = start_drivers(conf, singa_conf, job_id, env, logs)
    try:
        deadline = time.monotonic() + 120
        while "Train @ step 400 " not in "".join(log.read_text() for log in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        procs[0].send_signal(signal.SIGUSR1)
        status = [p.wait(timeout=60) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail("\n".join(log.read_text()[-3000:] for log in logs))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    text = "\n".join(log.read_text() for log in logs)
    assert status[0] == 128 + signal.SIGUSR1 and status[1:] == [0, 0], (status, text)
    assert "singa: stopped by SIGUSR1 after a snapshot" in text and "Traceback" not in text
    steps = {int(s) for s in re.findall(r"stopping at step (\d+) after a snapshot", text)}
    assert len(steps) == 1, text
    (step,) = steps
    assert 400 < step < 1200, step      # a step or two (0.25 s of steps) after the signal
    folder = tmp_path / "signalled" / "checkpoint"
    assert {p.name for p in folder.glob(f"step{step}-worker*.bin")} == \
        {f"step{step}-worker0.bin", f"step{step}-worker1.bin"}
    resumed = run_job(conf, singa_conf, zk_server, 3, flags=("-resume",))
    assert all(rc == 0 for rc, _ in resumed), resumed
    assert f"Resume from step {step}" in "".join(log for _, log in resumed)
    for w in (0, 1):
        ours = CheckpointReader(str(folder / f"step1200-worker{w}.bin"))
        ref = CheckpointReader(str(tmp_path / "whole" / "checkpoint" / f"step1200-worker{w}.bin"))
        for name in ref.names:
            np.testing.assert_array_equal(ours.param(name), ref.param(name), err_msg=name)
