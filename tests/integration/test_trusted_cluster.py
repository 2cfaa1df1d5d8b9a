"""A trusted cluster: real `singa` processes of a Sandblaster job over CURVE, attacked by a
foreign peer built with the project's own codec, and by a foreign ZooKeeper client."""
import re
import subprocess
import threading
import time

import numpy as np
import pytest
import zmq
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from conftest import PYTHON, new_job, start_drivers
from singa.checkpoint import CheckpointReader
from singa.cluster.cluster_rt import ZKClusterRuntime
from singa.cluster.zk import ZKService, job_path
from singa.comm import msg as m
from singa.comm import param_msg as pm

SANDBLASTER = "nworkers_per_group: 2 nservers_per_group: 1 server_worker_separate: true"
DOWNPOUR = "nworker_groups: 2 server_worker_separate: true"
STEPS = 2000        # some 15 s of training: the attack runs through it
# |attacked - reference| / |reference| allowed for a Downpour snapshot's params taken whole
# (one vector, w1's 50,176 floats its bulk): asynchrony alone puts two unattacked runs of the
# same seed 0.17-0.43 apart (measured, CI's load the farthest); a forged Put of zeros left in
# w1 is 1.0, a forged Update of noise hundreds. A single small param is no measure: CI once
# put the 10 floats of bias2, which no forgery addresses, 1.06 apart.
DOWNPOUR_TOLERANCE = 0.75


def job_conf(fixture_job, tmp_path, name, steps=60, layout=SANDBLASTER):
    groups = "" if "nworker_groups" in layout else "nworker_groups: 1 "
    return fixture_job(name + ".conf", workspace=tmp_path / name, edits={
        "cluster { nworker_groups: 1 nserver_groups: 1":
            f"cluster {{ {groups}nserver_groups: 1 {layout}",
        "train_steps: 200": f"train_steps: {steps}", "test_freq: 100": "test_freq: 0",
        "checkpoint_freq: 100": "checkpoint_freq: 0", "disp_freq: 20": "disp_freq: 10"},
        head="seed: 7\n")


def start(conf, singa_conf, zk_server, nprocs=3):
    """The job's processes, each logging to `<conf>.<i>.log` (a file: an unread pipe would
    fill up and stall the job)."""
    job_id, env, trust = new_job(zk_server)
    logs = [f"{conf}.{i}.log" for i in range(nprocs)]
    procs = start_drivers(conf, singa_conf, job_id, env, logs)
    for p, log in zip(procs, logs):
        p.log = log
    return job_id, trust, procs


def finish(procs, timeout=300):
    """The processes' logs once they have ended."""
    try:
        deadline = time.monotonic() + timeout
        for p in procs:
            p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [open(p.log).read() for p in procs]


def forgeries():
    """Well-formed param messages of the job's protocol: a Put of zeros, an Update of noise
    and a Stop, to a worker's share, a server and the stub."""
    w, server = m.addr(0, 0, m.kWorkerParam), m.addr(0, 0, m.kServer)
    zeros, noise = np.zeros(784 * 64, np.float32), np.random.default_rng(0).normal(
        0, 100, 784 * 64).astype(np.float32)
    return [pm.put(w, m.STUB, 0, 0, 1.0, 1.0, -1, zeros),
            pm.slice_put(m.addr(0, 0, m.kStub), server, 0, 0, 0, 1, 1, 1, -1, [zeros]),
            pm.update(w, m.STUB, 1, [0], [noise]),
            pm.slice_update(m.addr(0, 0, m.kStub), server, 1, [(0, 0, 2, noise)]),
            m.Msg(w, m.STUB, m.kStop), m.Msg(m.STUB, server, m.kStop), m.Msg(w, server, m.kStop)]


def vm_rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1])


def train_losses(text):
    return [float(x) for x in re.findall(r"Train @ step \d+  Loss = ([\d.]+)", text)]


@pytest.mark.parametrize("layout", [SANDBLASTER, DOWNPOUR], ids=["sandblaster", "downpour"])
def test_strangers_cannot_change_a_job_nor_grow_it(layout, fixture_job, singa_conf, zk_server,
                                                   tmp_path):
    """Forged Put/Update/Stop from plain tcp and from CURVE clients of other keys, to every
    process's port, all through the run: a Sandblaster job ends with exactly the params of an
    unattacked run of the same seed; an asynchronous Downpour job (not reproducible) with the
    loss of one (before the fix a forged Put of zeros sent its loss from 0.03 to 1.8) and a
    final snapshot finite, w1 not zeroed, its params within DOWNPOUR_TOLERANCE of the
    reference run's. A 1 GiB
    frame (from a peer holding the job's keys) is refused at the socket: the process does not
    grow by it."""
    exact = layout == SANDBLASTER
    job_id, trust, procs = start(job_conf(fixture_job, tmp_path, "attacked", STEPS, layout),
                                 singa_conf, zk_server)
    ctx = zmq.Context()
    growth, stop = {}, threading.Event()
    try:
        with ZKService(zk_server) as zk:
            rt = ZKClusterRuntime(zk, job_id)
            endpoints = [rt.proc_endpoint(k, timeout=60) for k in range(3)]
            pids = [int(zk.client.get(f"{job_path(job_id)}/proc/proc-{k}")[0].decode()
                        .rsplit("|", 1)[1]) for k in range(3)]
        socks = []
        for endpoint in endpoints:
            for keys in (None, zmq.curve_keypair()):
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                if keys is not None:
                    sock.curve_serverkey = trust.server_public
                    sock.curve_publickey, sock.curve_secretkey = keys
                sock.connect("tcp://" + endpoint)
                socks.append(sock)

        def attack():
            sent = 0
            while not stop.is_set():
                for sock in socks:
                    for msg in forgeries():
                        try:    # a socket whose handshake failed has no peer to queue for
                            sock.send_multipart([msg.header(), *msg.frames], zmq.NOBLOCK)
                            sent += 1
                        except zmq.Again:
                            pass
                time.sleep(0.05)
            growth["sent"] = sent
        attacker = threading.Thread(target=attack, daemon=True)
        attacker.start()

        big = ctx.socket(zmq.DEALER)        # an insider's oversized frame
        big.setsockopt(zmq.LINGER, 0)
        big.curve_serverkey = trust.server_public
        big.curve_publickey, big.curve_secretkey = trust.client_public, trust.client_secret
        big.connect("tcp://" + endpoints[0])
        before = vm_rss_kb(pids[0])
        big.send_multipart([m.Msg(m.addr(0, 0, m.kWorkerParam), m.STUB, m.kStop).header(),
                            np.zeros(1 << 30, np.uint8)], copy=False)
        time.sleep(3)
        assert procs[0].poll() is None, finish(procs)
        growth[0] = vm_rss_kb(pids[0]) - before
        big.close()
        outs = finish(procs)
    finally:
        stop.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
    attacker.join(10)
    assert not attacker.is_alive() and growth["sent"] > 0
    for sock in socks:
        sock.close()
    ctx.term()
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)
    assert growth[0] < 200 * 1024, growth           # KB: far below the 1 GiB frame
    assert "Trained steps 0-%d" % STEPS in outs[0] + outs[1] + outs[2]
    attacked = train_losses("".join(outs))
    _, _, ref = start(job_conf(fixture_job, tmp_path, "reference", STEPS, layout), singa_conf,
                      zk_server)
    outs = finish(ref)
    assert all(p.returncode == 0 for p in ref), "\n".join(outs)
    snapshot = f"step{STEPS}-worker0.bin"
    ours = CheckpointReader(str(tmp_path / "attacked" / "checkpoint" / snapshot))
    theirs = CheckpointReader(str(tmp_path / "reference" / "checkpoint" / snapshot))
    if not exact:
        reference = train_losses("".join(outs))
        assert max(attacked[-5:]) < 0.2 and abs(attacked[-1] - reference[-1]) < 0.1, \
            (attacked, reference)
        # the snapshot too: finite, w1 not zeroed by a forged Put, the params as far from the
        # reference run's as asynchrony takes two unattacked runs (DOWNPOUR_TOLERANCE)
        for name in theirs.names:
            assert np.isfinite(ours.param(name)).all(), name
        a, r = (np.concatenate([ckpt.param(n).ravel() for n in theirs.names])
                for ckpt in (ours, theirs))
        distance = np.linalg.norm(a - r) / np.linalg.norm(r)
        print(f"downpour: |attacked - reference| / |reference| = {distance:.3f}")
        assert distance < DOWNPOUR_TOLERANCE, distance
        w1 = next(n for n in theirs.names if n.endswith("weight1"))
        assert np.linalg.norm(ours.param(w1)) > 0.5 * np.linalg.norm(theirs.param(w1)), w1
        return
    for name in theirs.names:
        np.testing.assert_array_equal(ours.param(name), theirs.param(name), err_msg=name)


def test_a_foreign_zookeeper_client_cannot_change_a_running_job(fixture_job, singa_conf,
                                                                 zk_server, tmp_path):
    """Delete a process's node, create a proc-done mark, rewrite an endpoint, change the ACL
    of a shared node: NoAuth each; the job goes on and ends normally. Anyone may still list
    it."""
    job_id, _, procs = start(job_conf(fixture_job, tmp_path, "guarded", steps=STEPS), singa_conf,
                             zk_server)
    job = job_path(job_id)
    foreign = KazooClient(hosts=zk_server)
    foreign.start(timeout=15)
    try:
        deadline = time.monotonic() + 60
        while len(foreign.get_children(f"{job}/proc") if foreign.exists(f"{job}/proc")
                  else []) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        refused = []
        for attempt in (lambda: foreign.delete(f"{job}/proc/proc-1"),
                        lambda: foreign.create(f"{job}/proc-done/proc-1"),
                        lambda: foreign.set(f"{job}/proc/proc-0", b"10.9.9.9:1|1"),
                        lambda: foreign.create(f"{job}/proc/proc-7", b"x"),
                        lambda: foreign.delete(f"{job}/proc-done"),
                        # the shared nodes: nobody may change their ACLs and lock launches out
                        lambda: foreign.set_acls("/singa/app", OPEN_ACL_UNSAFE),
                        lambda: foreign.set_acls("/singa/sys/job-lock", OPEN_ACL_UNSAFE)):
            with pytest.raises(NoAuthError):
                attempt()
            refused.append(True)
        assert foreign.get_children(f"{job}/proc") == sorted(["proc-0", "proc-1", "proc-2"]) \
            or len(foreign.get_children(f"{job}/proc")) == 3
    finally:
        foreign.stop()
        foreign.close()
    outs = finish(procs)
    assert len(refused) == 7
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)


def test_malformed_shared_nodes_are_one_line(singa_conf, zk_server, tmp_path, fixture_job):
    """/singa/sys/host-idx is shared by every job and writable by anyone: garbage in it is a
    warning, never a traceback or a blocked launch."""
    with ZKService(zk_server) as zk:
        zk.client.set("/singa/sys/host-idx", b"\xff not a number")
    r = subprocess.run([PYTHON, "-m", "singa.cluster.tool", "genhost", "-confdir",
                        str(singa_conf.parent)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "localhost\n", r.stderr
    assert "Traceback" not in r.stderr and "host-idx holds" in r.stderr, r.stderr
