"""Running a JobProto from Python (what `singa.model` calls): train, test and predict.

A job of one process runs in the calling process with the in-process cluster runtime
(`cluster_rt.SPClusterRuntime`: no ZooKeeper), through the same Driver, Process and executors
as `singa-run.sh`. While it runs, the `singa` logger writes to `<workspace>/<job name>.log`
(and to stderr: warnings as plain `singa: ...` lines, or SINGA's log lines when `verbose`),
SIGINT and SIGTERM stop a training job after a snapshot a step or two later (a second one
at once; a test at once), and a progress bar shows steps/s and the latest metrics;
afterwards the caller's handlers and logging are back, and a signal that stopped the job is
delivered to the caller's own handler (`deliver`; SIGINT: KeyboardInterrupt). Every
training run writes the job it runs to `<workspace>/run.conf` (beside the log; a workspace's
own job.conf stays untouched). A job of several processes (numpy data written as kvfiles
beside it) is launched from there with `bin/singa-run.sh` (ZooKeeper, conf/hostfile); its
History is read back from `<workspace>/metrics.csv`.
"""
import contextlib
import importlib.util
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
from google.protobuf import text_format

import singa
from singa import checkpoint, files
from singa import log as singa_log
from singa.api.resume import check_resumable, newest_snapshot
from singa.cluster.cluster_rt import SPClusterRuntime
from singa.device import host
from singa.driver import Driver, Stopped
from singa.errors import ClusterError, ConfigError
from singa.io import memory
from singa.io.records import write_records
from singa.job import config, topology, workspace
from singa.net.phase import in_phase
from singa.proto import job_pb2
from singa.train import evaluation
from singa.watch.metrics import History, Reporter, read_rows

log = logging.getLogger("singa")

#: Input layers whose store a prediction replaces by the numpy batch.
STORE_INPUTS = (job_pb2.kRecordInput, job_pb2.kCSVInput)
PREDICT_BATCH = 256
#: seconds between two reads of a launched job's metrics.csv for `on_event`
LAUNCH_POLL = 0.5


def prepare(job, base=None):
    """A validated copy of `job` with relative paths resolved against `base` (default: the
    current directory): what `singa-run.sh -conf` would read, checked the same way. The
    workspace is made with its parents."""
    job = config.absolute_paths(copy_job(job), base or os.getcwd())
    if job.cluster.workspace:
        workspace.make(job.cluster.workspace, parents=True)
    text = text_format.MessageToString(job)
    return config.parse_job(text, f"<job '{job.name}'>")


def train(job, resume=False, verbose=False, progress=True, on_event=None,
          zookeeper_host=None):
    """Train the prepared `job` (testing and validating as it says); returns its History.
    `resume`: continue from the newest snapshot of its workspace: True (found and checked
    here), or that Snapshot as the caller found and checked it (`singa.api.resume`: nothing
    is read again). `on_event(step, phase, metrics)` hears each display, test and validation
    (in the worker's thread; for a job of several processes, from its metrics.csv in this
    one); once it returns True the job stops a step or two later, after a snapshot. A job of
    several processes uses the ZooKeeper at `zookeeper_host` (default: conf/singa.conf's)."""
    snap = resume if isinstance(resume, checkpoint.Snapshot) else \
        check_resumable(job, newest_snapshot(job)) if resume else None
    if topology.nprocs(job.cluster) > 1:
        return _launch(job, bool(resume), verbose, zookeeper_host, on_event)
    write_conf(job)
    history = History()
    bar = _progress(job, progress, snap.step if snap is not None else 0)

    def listener(step, phase, values):
        history.add(step, phase, values)
        if phase == "train":
            bar.update(step + 1 - bar.n)
            bar.set_postfix(values, refresh=False)
    try:
        _, history.stopped_by = _run_here(job, False, snap or resume, verbose, listener,
                                          history.add_snapshot, on_event)
        # retention may have deleted some; the last is where training ended (a callback's
        # stop or a signal's may come before train_steps)
        history.snapshots = [(s, p) for s, p in history.snapshots if os.path.exists(p)]
        bar.update((history.snapshots[-1][0] if history.snapshots else job.train_steps) - bar.n)
    finally:
        bar.close()
    return history


def test(job, verbose=False, listener=None):
    """Test the params `job.checkpoint_path` names on `test_steps` batches (or the whole pass
    of its numpy data); {metric: value}. `listener(step, "test", metrics)` hears the result."""
    if not job.test_steps:
        raise ConfigError(f"{job.name}: testing needs test_steps > 0")
    result, stopped_by = _run_here(job, True, False, verbose, listener, None)
    deliver(stopped_by)
    return result


def deliver(signum):
    """Hand the signal that stopped a job (None: none did) to the caller's own handler, as it
    would have had it: SIGINT's default raises KeyboardInterrupt. A fit calls this once it
    has kept what the job trained (`History.stopped_by`)."""
    if signum:
        signal.raise_signal(signum)


def predict(job, x):
    """The outputs of `job`'s test net for the numpy samples `x`, its params read from the
    checkpoint files `job.checkpoint_path` names: per sample, the probabilities of a softmax loss layer, the
    reconstruction of a Euclidean loss layer, the prediction of a mean squared error (kMSELoss),
    else the data of the net's last layer. `x` is
    fed through the net's input layer, so its preprocessing applies (mean, std, crop)."""
    x = np.asarray(x)
    inputs = [layer for layer in job.neuralnet.layer if layer.type in STORE_INPUTS
              and in_phase(layer, job_pb2.kTest)]
    if not inputs:
        raise ConfigError(f"{job.name}: predict needs an input layer that reads a store "
                          f"(kRecordInput or kCSVInput) in the test net")
    shape = tuple(inputs[0].store_conf.shape)
    if x.shape == shape or (x.ndim == 1 and x.size == int(np.prod(shape))):
        raise ConfigError(f"predict: x of shape {x.shape} is one sample; give a batch of one, "
                          f"x[None] (shape {(1,) + x.shape})")
    if x.shape[1:] != shape and (x.ndim != 2 or x.shape[1] != int(np.prod(shape))):
        hint = ""
        if x.ndim == 4 and x.shape[1:] == shape[1:] + shape[:1]:
            hint = ": images are (N, C, H, W); give x.transpose(0, 3, 1, 2)"
        raise ConfigError(f"predict: samples of shape {x.shape[1:]} do not fit input layer "
                          f"'{inputs[0].name}' of shape {shape}{hint}")
    n = len(x)
    batch = min(n, PREDICT_BATCH)
    path = memory.register(x.reshape((n,) + shape))
    try:
        net_conf = job_pb2.NetProto()
        net_conf.CopyFrom(job.neuralnet)
        for layer in net_conf.layer:
            if layer.type in STORE_INPUTS:
                sc = layer.store_conf
                sc.backend, sc.path, sc.random_skip = "memory", path, 0
                del sc.batchsize[:]
                sc.batchsize.append(batch)
                layer.type = job_pb2.kRecordInput
        net, _ = evaluation.loaded_test_net(job, "predict", net_conf)
        out = None
        try:
            with net.device.selected():
                for start in range(0, n, batch):
                    net.forward(job_pb2.kTest | job_pb2.kForward)
                    y = host(_output(net))
                    if out is None:
                        out = np.empty((n,) + y.shape[1:], np.float32)
                    out[start:start + batch] = y[:n - start]
        finally:
            net.close()
        return out
    finally:
        memory.release(path)


def _output(net):
    losses = [layer for layer in net.layers if layer.conf.type in (
        job_pb2.kSoftmaxLoss, job_pb2.kCudnnSoftmaxLoss, job_pb2.kEuclideanLoss,
        job_pb2.kMSELoss)]
    if not losses:
        return net.layers[-1].data
    last = losses[-1]
    if last.conf.type in (job_pb2.kEuclideanLoss, job_pb2.kMSELoss):
        return net.srclayers[last.name][0].data
    return last.data


def _run_here(job, test, resume, verbose, listener, on_snapshot, on_event=None):
    """Run `job` in this process; (the test's metrics or None, the signal that stopped it or
    None). SIGINT and SIGTERM stop a training job after a snapshot (a second one at once)."""
    rt = SPClusterRuntime(-os.getpid())   # never a ZooKeeper job id

    def hear(step, phase, values):
        if listener is not None:
            listener(step, phase, values)
        if on_event is not None and on_event(step, phase, values):
            driver.stop_after_snapshot(step + 1)
    reporter = Reporter(job.cluster.workspace, rt.job_id, hear, on_snapshot)
    driver = Driver(job, rt, "localhost", resume, reporter)
    driver.resume_hint = "fit(..., resume=True)"
    if not test:
        driver.snapshot_signals = (signal.SIGINT, signal.SIGTERM)
    result = None
    with _logging(job, verbose), _signals(driver.on_signal):
        try:
            result = driver.run(test)
            if not test and not driver.signal:
                hint = "fit(...) again continues; another process: fit(..., resume=True)"
                for line in reporter.summary(job.step, job.train_steps, hint):
                    log.info("%s", line)
        except Stopped:
            pass
    return result, driver.signal


@contextlib.contextmanager
def _logging(job, verbose):
    """The `singa` logger to `<workspace>/<name>.log` and stderr for the run: warnings as
    `singa: <message>` lines, or with `verbose` every line in SINGA's format; the caller's
    handlers, level and propagation afterwards."""
    logger = singa_log.LOGGER
    saved = logger.handlers[:], logger.level, logger.propagate
    path = os.path.join(job.cluster.workspace, workspace.LOG.format(name=job.name))
    try:
        to_file = logging.FileHandler(path)
    except OSError as e:
        raise ConfigError(f"cannot write the job log {path}: {e.strerror}") from None
    console = _BesideBar(sys.stderr)
    # not the failure the caller gets raised; without verbose, warnings and the few info
    # lines marked to be shown (log.SHOWN)
    console.addFilter(lambda r: not getattr(r, "raised", False) and (
        verbose or r.levelno >= logging.WARNING or getattr(r, "shown", False)))
    to_file.setFormatter(singa_log.GlogFormatter())
    # SINGA's log lines when asked for (verbose); else warnings as short plain lines
    console.setFormatter(singa_log.GlogFormatter() if verbose else
                         logging.Formatter("singa: %(message)s"))
    logger.handlers[:] = [to_file, console]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        to_file.close()
        logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


class _BesideBar(logging.StreamHandler):
    """A console handler that writes beside a progress bar: the bar is cleared for the line
    and drawn again below it (else a notebook shows the bar's line twice, above and below)."""

    def emit(self, record):
        try:
            from tqdm import tqdm
        except ImportError:
            super().emit(record)
            return
        with tqdm.external_write_mode(file=self.stream):
            super().emit(record)


@contextlib.contextmanager
def _signals(handler):
    """`handler` for SIGINT and SIGTERM while the job runs (main thread only), then the
    caller's handlers again."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # a signal the caller ignores (a background job's SIGINT) stays ignored
    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)
             if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def _progress(job, enabled, start=0):
    """A tqdm bar over the train steps from `start` (a widget in Jupyter when ipywidgets is
    there, else text), or a silent stand-in."""
    if not enabled:
        return _NoBar(start)
    try:
        if importlib.util.find_spec("ipywidgets"):
            from tqdm.auto import tqdm
        else:       # tqdm.auto would warn in a notebook without the widgets
            from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=job.train_steps, initial=start, unit="step", desc=job.name, leave=True)


class _NoBar:
    def __init__(self, start):
        self.n = start

    def update(self, k):
        self.n += k

    def set_postfix(self, *args, **kwargs):
        pass

    def close(self):
        pass


# --- jobs of several processes ------------------------------------------------------------

def _launch(job, resume, verbose, zookeeper_host=None, on_event=None):
    """Run `job` through `bin/singa-run.sh` (ZooKeeper, conf/hostfile); its History from
    metrics.csv, whose rows `on_event` hears as they come (every LAUNCH_POLL s; True stops the
    job after a snapshot: SIGUSR1 to the launcher). With `zookeeper_host` the launcher reads
    a conf folder of its own, `<workspace>/conf` (singa.conf naming that ZooKeeper, the
    hostfile copied). What the launcher says of a ZooKeeper it leaves running is shown.
    Ctrl-C stops the job after a snapshot (the History's `stopped_by`); a second one at once
    (singa-run.sh stops every process), re-raised."""
    launcher = os.path.join(singa.HOME, "bin", "singa-run.sh")
    if not os.path.isfile(launcher):
        raise ConfigError(f"a job of {topology.nprocs(job.cluster)} processes is launched by "
                          f"bin/singa-run.sh of a SINGA checkout, and {singa.HOME} has none")
    ws = job.cluster.workspace
    job = with_kvfiles(job, ws)
    conf = write_conf(job)
    cmd = [launcher, "-conf", conf] + (["-resume"] if resume else [])
    started = time.time()
    env = None
    if zookeeper_host:
        env = dict(os.environ, SINGA_CONF=_conf_folder(ws, zookeeper_host))
    # a process group of its own: a Ctrl-C reaches this process, which has the job snapshot
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, process_group=0)
    lines, jobs = [], []      # the job ids of the launch: one more per whole-job restart

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            m = re.match(r"Unique JOB_ID is (\d+)", line)
            if m:
                jobs.append(int(m.group(1)))
            if verbose or "ZooKeeper keeps running" in line:
                print(line, end="", file=sys.stderr)
    reader = threading.Thread(target=read, daemon=True, name="launcher-output")
    reader.start()
    metrics_csv = os.path.join(ws, workspace.METRICS)
    heard, asked, stopped_by = (None, 0), False, None
    try:
        while True:
            try:
                rc = proc.wait(timeout=LAUNCH_POLL)
                break
            except subprocess.TimeoutExpired:
                pass
            except KeyboardInterrupt:   # as SIGINT stops a job of this process: a snapshot
                log.warning("SIGINT: a snapshot in a step or two, then the job stops")
                proc.send_signal(signal.SIGUSR1)
                asked, stopped_by = True, signal.SIGINT
                continue
            if on_event is not None and jobs and not asked:
                heard, stop = _hear(metrics_csv, jobs[-1], heard, on_event)
                if stop:    # singa-run.sh: a snapshot a step or two later, then exit 138
                    proc.send_signal(signal.SIGUSR1)
                    asked = True
        reader.join()
    except KeyboardInterrupt:   # a second one: singa-run.sh stops every process at once
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise
    job_id = jobs[-1] if jobs else None
    if on_event is not None and job_id is not None and not asked:
        _hear(metrics_csv, job_id, heard, on_event)
    if rc != 0 and not (asked and rc == 128 + signal.SIGUSR1):
        last = next((s for s in reversed(lines) if s.strip()), "")
        raise ClusterError(f"job {job_id if job_id is not None else '?'} ({conf}) failed with "
                           f"exit {rc}: {last}")
    # each run of a restarted job resumed its predecessor's snapshot: its rows replace theirs
    history = History.from_rows([r for r in read_rows(metrics_csv) if r["job"] in jobs])
    folder = checkpoint.folder(ws)
    for snap in checkpoint.list_snapshots(folder, job.cluster.nworkers_per_group):
        if snap.complete and 0 in snap.files and os.path.getmtime(snap.files[0]) >= started:
            history.add_snapshot(snap.step, snap.files[0])
    history.stopped_by = stopped_by
    return history


def _hear(path, job_id, heard, on_event):
    """Hand `on_event` the events of job `job_id` (group 0's rows of metrics.csv `path`, one
    event a run of rows of one phase and step) after those `heard` ((job id, count): none of
    another job, the restart of a job); ((job id, events heard), whether one of them asked to
    stop)."""
    events = []
    for r in read_rows(path, job_id):
        if r["group"] != 0:
            continue
        if not events or events[-1][:2] != (r["phase"], r["step"]):
            events.append((r["phase"], r["step"], {}))
        events[-1][2][r["metric"]] = r["value"]
    stop = False
    for phase, step, values in events[heard[1] if heard[0] == job_id else 0:]:
        stop = bool(on_event(step, phase, values)) or stop
    return (job_id, len(events)), stop


def _conf_folder(ws, zookeeper_host):
    """`<ws>/conf` (the workspace's): the SINGA home's singa.conf naming `zookeeper_host`,
    and its hostfile; returns the folder."""
    home = os.environ.get("SINGA_CONF") or os.path.join(singa.HOME, "conf")
    conf = config.load_singa_conf(os.path.join(home, "singa.conf"))
    conf.zookeeper_host = zookeeper_host
    folder = os.path.join(ws, workspace.CONF)
    os.makedirs(folder, exist_ok=True)
    text = text_format.MessageToString(conf).encode()
    files.write_atomic(os.path.join(folder, "singa.conf"), lambda f: f.write(text))
    hostfile = os.path.join(home, "hostfile")
    if os.path.isfile(hostfile):
        files.copy_atomic(hostfile, os.path.join(folder, "hostfile"))
    return folder


def with_kvfiles(job, folder, prefix=""):
    """A copy of `job` whose numpy data (memory stores) are kvfiles written in `folder`,
    `<prefix><layer>-<phases>.bin`: what another process can read."""
    job = copy_job(job)
    for layer in job.neuralnet.layer:
        sc = layer.store_conf
        if sc.backend == "memory":
            x, y = memory.arrays(sc.path)
            shard = os.path.join(folder, f"{prefix}{layer.name}-{_phase_name(layer)}.bin")
            write_records(shard, x, y, sc.target_dim)
            sc.backend, sc.path = "kvfile", shard
    return job


def write_conf(job):
    """`<workspace>/run.conf`: the text of the job that runs (numpy data appear as memory://
    paths of this process), written whole or not at all; returns its path."""
    path = os.path.join(job.cluster.workspace, workspace.RUN_CONF)
    text = text_format.MessageToString(job).encode()
    files.write_atomic(path, lambda f: f.write(text))
    return path


def _phase_name(layer):
    return "-".join(job_pb2.Phase.Name(p)[1:].lower() for p in layer.include) or "all"


def copy_job(job):
    out = job_pb2.JobProto()
    out.CopyFrom(job)
    return out

