"""Fixtures of the integration tests: a real ZooKeeper server, a singa.conf pointing at it, and
runs of the `singa` driver on SINGA's fixture jobs."""
import os
import re
import shlex
import socket
import subprocess
import time

import numpy as np
import pytest
from google.protobuf import text_format
from kazoo.client import KazooClient

import processes
import singa
from singa.cluster.job_manager import JobManager
from singa.cluster.zk import ZKService
from singa.comm.trust import ENV, JobTrust, new_secret
from singa.io.kvfile import KVFile
from singa.io.records import decode_batch
from singa.job import config
from singa.proto import job_pb2

ZK_SERVICE = os.path.join(singa.HOME, "bin", "zk-service.sh")


def accuracy_at(log, step):
    """The test accuracy a job's log shows at `step`: on the metrics line its "Test @ step"
    line's thread writes next (other processes' lines come between where their logs share a
    file, as under Slurm)."""
    test = re.search(rf"^\S+ \S+ +(\d+) \S+\] Test @ step {step}$", log, re.M)
    assert test, f"no test at step {step} in the log"
    return float(re.search(rf"^\S+ \S+ +{test[1]} \S+\]\s+Loss = \S+, accuracy = ([\d.]+)",
                           log[test.end():], re.M)[1])


def asynchronous_accuracy(logs, one, steps):
    """(the median of the test accuracies of an asynchronous job of two worker groups at
    `steps`, its last few tests; those of one worker's log `one` from steps[0] to 2·steps[-1],
    at the same interval): group 0 tests whenever it gets there, so its params have seen
    between one worker's steps[0] and 2·steps[-1] batches; and a single test swings as the
    machine interleaves the groups' updates (Downpour on a loaded machine: 0.706, 0.716, 0.778
    at steps 200-300 where one worker spans 0.73-0.788)."""
    ours = sorted(accuracy_at(logs, s) for s in steps)[len(steps) // 2]
    every = steps[1] - steps[0]
    return ours, [accuracy_at(one, s) for s in range(steps[0], 2 * steps[-1] + 1, every)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_job(zk_server):
    """A job id made as bin/singa-run.sh makes one: a secret of its own, in the environment
    returned for the job's processes, and the job's node in ZooKeeper guarded by it. Returns
    (job id, environment, JobTrust)."""
    secret = new_secret()
    trust = JobTrust(secret)
    with ZKService(zk_server, trust=trust) as zk:
        job_id = JobManager(zk).new_job_id(trust)
    return job_id, dict(os.environ, **{ENV: secret}), trust


def start_drivers(conf, singa_conf, job_id, env, logs, flags=()):
    """A `singa` driver of job `job_id` per path of `logs`, each logging to its file (a file:
    an unread pipe fills up and stalls the job); the i-th is process i (`-procs_id`, as
    bin/singa-run.sh numbers them)."""
    procs = []
    for i, log in enumerate(logs):
        with open(log, "w") as out:
            procs.append(subprocess.Popen([PYTHON, "-m", "singa.driver", "-conf", str(conf),
                                           "-singa_conf", str(singa_conf), "-singa_job",
                                           str(job_id), "-procs_id", str(i), *flags], env=env,
                                          stdout=out, stderr=subprocess.STDOUT))
    return procs


def zk_service(cmd, env, check=True):
    """bin/zk-service.sh `cmd` (start|stop) with `env` (ZK_PORT, ZK_DATA, ...). A server it
    starts is tracked by pid (processes.track); one it stops is seen gone (and stopped by pid
    if the script's stop did not end it). Returns the CompletedProcess; with `check`, a failure
    fails the test."""
    pid_path = os.path.join(env["ZK_DATA"], "zookeeper.pid")
    pid = processes.pid_file(pid_path, 0) if cmd == "stop" and os.path.exists(pid_path) else None
    done = subprocess.run(["bash", ZK_SERVICE, cmd], env=env, capture_output=True, text=True)
    if check and done.returncode != 0:
        pytest.fail(f"zk-service.sh {cmd} failed: {done.stderr.strip()}", pytrace=False)
    if cmd == "start" and done.returncode == 0:
        processes.track(processes.pid_file(pid_path),
                        f"ZooKeeper on port {env.get('ZK_PORT')} ({env['ZK_DATA']})")
    if pid is not None:
        processes.stop_server(pid)
    return done


@pytest.fixture(scope="session", autouse=True)
def nothing_outlives_the_run(tmp_path_factory):
    """Every server a test starts is gone when the run ends, whether its tests pass, fail or
    are interrupted (pytest runs finalizers on Ctrl-C): each fixture stops its own by pid and
    waits. This finalizer, the run's last, checks that no tracked server is left, nor any
    process whose command line or environment names the run's temporary folder (what a test
    started), and stops those that are."""
    base = os.path.join(str(tmp_path_factory.getbasetemp()), "")
    yield
    left = processes.servers_left()
    processes.stop_servers()
    deadline = time.monotonic() + 10       # a process signalled by the last test may be ending
    while (strays := processes.mentioning(base)) and time.monotonic() < deadline:
        time.sleep(0.2)
    processes.stop([pid for pid, _ in strays], 5.0)
    assert not left and not strays, \
        f"still running when the test run ends: servers {left}, processes of its tests {strays}"


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    """A ZooKeeper server of the test run (bin/zk-service.sh, free port, tmp data); yields
    "127.0.0.1:<port>". Jobs killed by tests stay listed in it (their nodes are protected)."""
    yield from zookeeper(tmp_path_factory)


@pytest.fixture
def zk(zk_server):
    """A ZKService to `zk_server`, whose /singa is emptied first."""
    z = ZKService(zk_server)
    JobManager(z).cleanup()
    z.close()
    z = ZKService(zk_server)
    yield z
    z.close()


@pytest.fixture
def raw(zk_server):
    """A plain kazoo client to look at the znodes."""
    c = KazooClient(zk_server)
    c.start(timeout=10)
    yield c
    c.stop()
    c.close()


def zookeeper(tmp_path_factory):
    """Run a ZooKeeper server of its own while the generator is open, yielding its
    "127.0.0.1:<port>": a module whose tests list every job overrides `zk_server` with one
    of its own, so that no other module's jobs are there."""
    port = free_port()
    env = dict(os.environ, ZK_PORT=str(port), ZK_DATA=str(tmp_path_factory.mktemp("zookeeper")),
               SINGA_MANAGES_ZK="true")
    zk_service("start", env)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        zk_service("stop", env, check=False)


@pytest.fixture
def closed_port():
    """A local TCP port that nothing listens on."""
    return free_port()


@pytest.fixture
def singa_conf(tmp_path, zk_server):
    """<tmp>/conf/singa.conf naming the test ZooKeeper, log_dir <tmp>/log, and a hostfile `localhost`."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "hostfile").write_text("localhost\n")
    path = conf / "singa.conf"
    path.write_text(f'zookeeper_host: "{zk_server}"\nlog_dir: "{tmp_path / "log"}/"\n')
    return path


@pytest.fixture
def env(singa_conf, zk_server):
    """The environment of a user whose SINGA_CONF is the tmp conf dir; ZooKeeper starts empty
    (a module that lists jobs has a `zk_server` of its own)."""
    with ZKService(zk_server) as zk:
        JobManager(zk).cleanup()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SINGA_") and k != "PYTHON"}
    env["SINGA_CONF"] = str(singa_conf.parent)
    return env


FAKE_SSH = """#!/usr/bin/env bash
# ssh stand-in: logs its arguments, runs the remote command here in a session of its own (a
# remote process outlives a killed ssh client), and exits with its status; a host whose name
# starts with "down" cannot be reached (exit 255 3 s later, as ssh's after its connect timeout).
printf '%s\\n' "$*" >> {log}
while [ $# -gt 0 ]; do
  case $1 in --) shift; break ;; -*) shift ;; *) break ;; esac
done
case $1 in down*) sleep 3; exit 255 ;; esac
shift   # the host
setsid bash -c "$*" <&0 &
wait $!
"""


@pytest.fixture
def ssh_env(env, tmp_path):
    """`env` with an `ssh` on PATH that runs commands here and logs its arguments to
    <tmp>/ssh.log (read it with ssh_env.log())."""
    bindir = tmp_path / "fake bin"
    bindir.mkdir()
    log = tmp_path / "ssh.log"
    log.touch()
    ssh = bindir / "ssh"
    ssh.write_text(FAKE_SSH.format(log=shlex.quote(str(log))))
    ssh.chmod(0o755)
    return dict(env, PATH=f"{bindir}:{env['PATH']}"), log


def launch(conf, env, log, *args):
    """bin/singa-run.sh -conf `conf` [args] running in a session of its own, its output in
    the file `log`."""
    with open(log, "w") as out:
        return subprocess.Popen([os.path.join(singa.HOME, "bin", "singa-run.sh"), "-conf",
                                 str(conf), *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(run, log, text, seconds=120):
    """Until `text` is in the file `log` of the launch `run` (which must still run)."""
    deadline = time.monotonic() + seconds
    while text not in log.read_text():
        assert time.monotonic() < deadline and run.poll() is None, log.read_text()
        time.sleep(0.1)


def job_process(run, procs_id, job_id=None):
    """The pid of process `procs_id` of the job of the launch `run`: its child, or, started
    over ssh, the process of job `job_id` launched with run's job conf (job ids repeat across
    the tests' ZooKeepers, which may run at once)."""
    parent = ["-P", str(run.pid)] if job_id is None else []
    conf = re.sub(r"([][.*+?(){}|^$\\])", r"\\\1", str(run.args[run.args.index("-conf") + 1]))
    pids = subprocess.run(["pgrep", *parent, "-f", f"^[^ ]*python[^ ]* -m singa.driver .*"
                           f"singa_job {job_id or ''}.*-conf {conf} .*procs_id {procs_id}( |$)"],
                          capture_output=True, text=True).stdout.split()
    assert len(pids) == 1, pids
    return int(pids[0])


def finish(run, log, timeout=300):
    """(exit code, output) of the launch `run` once it ends (its session killed after
    `timeout` s)."""
    try:
        rc = run.wait(timeout=timeout)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, 9)
    return rc, log.read_text()


@pytest.fixture
def singa_popen(singa_conf):
    """popen(conf, *flags): the driver as a running Popen (stdout and stderr to one log file
    beside conf, `<conf>.log`), for tests that kill it."""
    def popen(conf, *flags):
        with open(f"{conf}.log", "w") as out:
            return subprocess.Popen([PYTHON, "-m", "singa.driver", "-conf", str(conf),
                                     "-singa_conf", str(singa_conf), *flags],
                                    stdout=out, stderr=subprocess.STDOUT)
    return popen


@pytest.fixture
def mlp_job(tmp_path):
    """job(name="job", workspace=None, edit=None, conf=FIXTURES/job.conf, **fields) writes
    <tmp>/<name>.conf: `conf` (default SINGA's fixture MLP, 784-64-10, 200 steps) with the
    workspace (default <tmp>/ws, created), the given top-level fields and `edit(JobProto)`
    applied; returns its path."""
    def job(name="job", workspace=None, edit=None, conf=os.path.join(FIXTURES, "job.conf"),
            **fields):
        proto = job_pb2.JobProto()
        with open(conf) as f:
            text_format.Parse(f.read(), proto)
        ws = workspace or tmp_path / "ws"
        os.makedirs(ws, exist_ok=True)
        proto.cluster.workspace = str(ws)
        for key, value in fields.items():
            if isinstance(value, (list, tuple)):
                getattr(proto, key)[:] = value
            else:
                setattr(proto, key, value)
        if edit is not None:
            edit(proto)
        path = tmp_path / f"{name}.conf"
        path.write_text(text_format.MessageToString(proto))
        return path
    return job


FIXTURES = os.path.join(singa.HOME, "tests", "fixtures", "singa-0.3")
PYTHON = os.path.join(singa.HOME, ".venv", "bin", "python")


def scaled_records(path):
    """(x float32 (N, 784) scaled to [0, 1] as std_value 255 scales it, labels) of an MNIST
    shard."""
    with KVFile(path) as f:
        x, y = decode_batch([v for _, v in f], 784)
    return x / np.float32(255), y


def fixture_proto(workspace, **fields):
    """SINGA's fixture MLP (784-64-10 on train-1000/test-500) as a JobProto with its data paths
    absolute, its workspace at `workspace` and JobProto `fields` set."""
    job = config.load_job(os.path.join(FIXTURES, "job.conf"), check_paths=False)
    job.cluster.workspace = str(workspace)
    for layer in job.neuralnet.layer:
        layer.store_conf.path = singa.resolve(layer.store_conf.path)
    for key, value in fields.items():
        setattr(job, key, value)
    return job


@pytest.fixture
def fixture_job(tmp_path):
    """Factory: SINGA's fixture job.conf (784-64-10 MLP on train-1000/test-500, 200 steps) written
    to <tmp>/<name> with its workspace at `workspace` (default <tmp>/ws); `edits` maps text of the
    conf to its replacement (each must occur) and `head` is put in front. Returns the path."""
    with open(os.path.join(FIXTURES, "job.conf")) as f:
        text = f.read()

    def write(name="job.conf", workspace=None, edits=None, head=""):
        conf = text.replace("/tmp/singa-fixture-ws", str(workspace or tmp_path / "ws"))
        for old, new in (edits or {}).items():
            assert old in conf, f"{old!r} is not in the fixture job.conf"
            conf = conf.replace(old, new)
        path = tmp_path / name
        path.write_text(head + conf)
        return path
    return write


NAN_CSV_JOB = """name: "csv-mlp"
train_steps: 20
checkpoint_freq: 2
train_one_batch { alg: kBP }
updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }
neuralnet {
  layer { name: "data" type: kCSVInput
    store_conf { backend: "textfile" path: "DATA" batchsize: 4 shape: 3 } }
  layer { name: "ip" type: kInnerProduct srclayers: "data" innerproduct_conf { num_output: 2 }
    param { name: "w" init { type: kGaussian std: 0.1 } }
    param { name: "b" init { type: kConstant value: 0 } } }
  layer { name: "loss" type: kSoftmaxLoss srclayers: "ip" srclayers: "data" }
}
cluster { workspace: "WS" }
"""


@pytest.fixture
def nan_csv_job(tmp_path):
    """<tmp>/csv.conf: an MLP of 20 steps (a snapshot every 2, workspace <tmp>/ws) on a CSV
    shard of 4 lines a step with a nan in the line step 6 reads. Returns the path."""
    data = tmp_path / "data.csv"
    lines = [f"{i % 2},{i % 3},{i % 5},{i % 7}" for i in range(40)]
    lines[25] = "1,0.5,nan,2"
    data.write_text("\n".join(lines) + "\n")
    conf = tmp_path / "csv.conf"
    conf.write_text(NAN_CSV_JOB.replace("DATA", str(data)).replace("WS", str(tmp_path / "ws")))
    return conf


@pytest.fixture
def run_driver(singa_conf, tmp_path):
    """Run `python -m singa.driver -conf CONF [flags] -singa_conf <fixture singa.conf>` (no -conf
    when CONF is None) from a directory other than the SINGA home; returns the CompletedProcess."""
    def run(conf, *flags, conf_file=singa_conf, timeout=180, env=None):
        job = ["-conf", str(conf)] if conf is not None else []
        return subprocess.run([PYTHON, "-m", "singa.driver", *job, *flags, "-singa_conf",
                               str(conf_file)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=timeout, env=dict(os.environ, **(env or {})))
    return run


MNIST = os.path.join(singa.HOME, "examples", "mnist")


@pytest.fixture(scope="session")
def mnist_data():
    """examples/mnist/{train,test}_data.bin (Fashion-MNIST shards), made by create_data.py if absent."""
    made = subprocess.run([PYTHON, os.path.join(MNIST, "create_data.py")],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    return MNIST
