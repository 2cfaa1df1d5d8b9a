"""The `singa` process (SINGA's src/main.cc + src/driver.cc): flags, setup, train or test.

    singa -conf JOB_CONF [-singa_conf SINGA_CONF] [-singa_job ID] [-host HOST|auto]
          [-host_rank N] [-procs_id N [-rejoin]] [-resume|-test]
          [-check [-oversubscribe]] [-user_proto FILE.proto]... [-user_layers FILE.py]...

Registers with ZooKeeper (a `cluster_rt.ZKClusterRuntime`; the Python API runs a one-process
job through the same Driver with the in-process runtime), holds the workspace, has
`runtime.Process` build this process's executors and run them (a thread per Server and per
Worker, talking to the Stub in the main thread over ZeroMQ), and reports user mistakes as one
line on stderr with exit code 2. The job's secret (`singa.comm.trust`) comes in SINGA_JOB_SECRET.
SIGINT, SIGTERM or SIGHUP (a terminal hangup) stops the executors; the exit code is then 128 +
the signal's number.
`-check` only checks the conf and the processes per host (`singa.cluster.launch`) and exits.
`-procs_id N` (ours): this process is process N of the job (bin/singa-run.sh numbers them;
otherwise the order of registration does); `-rejoin`: it restarts lost process N of a running
asynchronous job (`topology.elastic_procs`), resuming from the newest snapshot with the
servers' params.
`-host_rank N` (ours): N processes of the job come before this one on its host
(bin/singa-run.sh counts them in job.hosts; a Slurm task's rank is SLURM_LOCALID: `host_rank`):
it takes the conf's `gpu` ids shifted by N × (max(gpu) + 1) (`device.of_process`), GPUs of its
own.
"""
import logging
import math
import os
import signal
import sys
import threading

import singa
from singa import checkpoint, device
from singa import log as singa_log
from singa.cluster import launch
from singa.cluster.cluster_rt import ZKClusterRuntime, failed_mark, lost_text
from singa.cluster.job_manager import JobManager
from singa.cluster.zk import ZKService, route_address
from singa.comm.liveness import DOWN_GRACE
from singa.comm.trust import ENV, JobTrust, new_secret
from singa.device import threads
from singa.errors import ClusterError, ConfigError, SingaError
from singa.job import config, topology, workspace
from singa.net import numerics
from singa.proto import job_pb2
from singa.train import evaluation
from singa.train.place import Place
from singa.train.runtime import Process, Transport, resume_from
from singa.train.worker import worker_class
from singa.watch.metrics import Reporter

log = logging.getLogger("singa")

# seconds a process waits for the other processes of its job to register; seconds without a
# message, ZooKeeper unreachable, after which it takes the others for lost (the environment's
# SINGA_REGISTER_TIMEOUT and SINGA_SILENCE_TIMEOUT, when set)
REGISTER_TIMEOUT, SILENCE_TIMEOUT = 20.0, 60.0
USAGE = ("usage: singa -conf JOB_CONF [-singa_conf SINGA_CONF] [-singa_job ID] [-host HOST] "
         "[-host_rank N] [-procs_id N [-rejoin]] [-resume|-test] [-check [-oversubscribe]] "
         "[-user_proto FILE.proto]... [-user_layers FILE.py]...")


def parse_flags(argv):
    """SINGA's flags: found anywhere in argv by exact match, value = the next argument."""
    flags = {name: f"-{name}" in argv
             for name in ("resume", "test", "check", "oversubscribe", "rejoin")}
    for name in ("-conf", "-singa_conf", "-singa_job", "-host", "-host_rank", "-procs_id"):
        if name in argv:
            i = argv.index(name)
            if i + 1 >= len(argv):
                raise ConfigError(f"flag {name} needs a value; {USAGE}")
            flags[name[1:]] = argv[i + 1]
    for name in ("-user_proto", "-user_layers"):   # repeatable; paths relative to the cwd
        at = [i for i, a in enumerate(argv) if a == name]
        if at and at[-1] + 1 >= len(argv):
            raise ConfigError(f"flag {name} needs a value; {USAGE}")
        flags[name[1:]] = [os.path.abspath(argv[i + 1]) for i in at]
    if "conf" not in flags:
        raise ConfigError(f"no job conf given; {USAGE}")
    if "procs_id" in flags:
        if not flags["procs_id"].isdigit():
            raise ConfigError(f"-procs_id {flags['procs_id']}: not a process number; {USAGE}")
        flags["procs_id"] = int(flags["procs_id"])
    elif flags["rejoin"]:
        raise ConfigError(f"-rejoin needs -procs_id; {USAGE}")
    if "host_rank" in flags:
        if not flags["host_rank"].isdigit():
            raise ConfigError(f"-host_rank {flags['host_rank']}: not a rank on the host; "
                              f"{USAGE}")
        flags["host_rank"] = int(flags["host_rank"])
    return flags


def host_rank(flag, host, env):
    """This process's rank among its job's processes on its host (`device.of_process`):
    `-host_rank` (`flag`, bin/singa-run.sh's); for a Slurm task (`host` auto, SLURM_JOB_ID set)
    SLURM_LOCALID, but 0 where Slurm gave the task GPUs of its own (SLURM_GPUS_PER_TASK: it
    sees them alone, from 0, through CUDA_VISIBLE_DEVICES); else 0 (a process started by
    hand)."""
    if flag is not None:
        return flag
    if host != "auto" or "SLURM_JOB_ID" not in env or "SLURM_GPUS_PER_TASK" in env:
        return 0
    local = env.get("SLURM_LOCALID", "0")
    if not local.isdigit():
        raise ConfigError(f"SLURM_LOCALID={local}: not a task's rank on its node")
    return int(local)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    driver = None
    try:
        flags = parse_flags(argv)
        rank = host_rank(flags.get("host_rank"), flags.get("host"), os.environ)
        conf_path = os.path.abspath(flags["conf"])
        job = config.load_job(conf_path, user_proto=flags["user_proto"],
                              user_layers=flags["user_layers"], test=flags["test"],
                              host_rank=rank)
        singa_conf_path = flags.get("singa_conf") or os.path.join(singa.HOME, "conf", "singa.conf")
        singa_conf = config.load_singa_conf(singa_conf_path)
        if flags["check"]:
            hostfile = os.path.join(os.path.dirname(os.path.abspath(singa_conf_path)), "hostfile")
            launch.check(job, conf_path, hostfile, flags["test"], flags["oversubscribe"])
            return 0
        trust = job_trust(job)
        set_timeouts(os.environ)
        with ZKService(singa_conf.zookeeper_host, trust=trust) as zk:
            job_id = int(flags.get("singa_job", -1))
            if job_id < 0:
                job_id = JobManager(zk).new_job_id(trust)
            driver = Driver(job, ZKClusterRuntime(zk, job_id, trust),
                            process_host(flags.get("host"), singa_conf.zookeeper_host),
                            flags["resume"] or flags["rejoin"],
                            Reporter(singa.resolve(job.cluster.workspace), job_id), trust,
                            flags.get("procs_id"), flags["rejoin"], rank)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
                signal.signal(sig, driver.on_signal)
            path = singa_log.setup(singa_conf.log_dir, f"{job_id}-{job.name}")
            if path:
                log.info("Record job log to %s", path)
            driver.run(flags["test"])
            if not flags["test"] and not driver.signal:
                hint = f"bin/singa-run.sh -conf {flags['conf']} -resume (raise train_steps first)"
                for line in driver.reporter.summary(job.step, job.train_steps, hint):
                    log.info("%s", line)
    except SingaError as e:
        print(f"singa: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:   # before the driver handles SIGINT itself
        print("singa: interrupted", file=sys.stderr)
        return 130
    except Stopped:
        pass
    if driver is not None and driver.signal:
        after = " after a snapshot" if driver.snapshot else ""
        print(f"singa: stopped by {signal.Signals(driver.signal).name}{after}", file=sys.stderr)
        return 128 + driver.signal
    return 0


def process_host(flag, zookeeper_host):
    """The host (or address) this process listens on: `-host`, `auto` meaning the address on
    the route to ZooKeeper (a Slurm task on its node); localhost when not given."""
    if flag == "auto":
        return route_address(zookeeper_host)
    return flag or "localhost"


def job_trust(job):
    """The JobTrust of the secret bin/singa-run.sh hands the job's processes; a job of one
    process started on its own makes its own."""
    trust = JobTrust.from_env()
    if trust is None:
        if topology.nprocs(job.cluster) > 1:
            raise ConfigError(f"{job.name}: a job of {topology.nprocs(job.cluster)} processes "
                              f"needs its secret in {ENV} (bin/singa-run.sh makes one per run)")
        trust = JobTrust(new_secret())
    return trust


class Stopped(BaseException):
    """SIGINT, SIGTERM or SIGHUP before the executors run: the driver leaves at once (a
    BaseException, like KeyboardInterrupt, so that no `except Exception` takes it for a
    failure)."""


class Driver:
    """One process of a job, coordinated through `cluster_rt` (a `singa.cluster.cluster_rt`
    ClusterRuntime): trains (continuing from the newest snapshot when `resume`) or tests.
    `reporter` (a `singa.watch.metrics.Reporter`, or None) receives what the workers display."""

    #: how the user continues a run, as its warnings name it
    resume_hint = "-resume"
    #: signals that stop the job after a snapshot, as SIGUSR1 does (a Python fit: SIGINT and
    #: SIGTERM, so that the model keeps what it trained); a repeat stops it at once
    snapshot_signals = ()

    def __init__(self, job, cluster_rt, host="localhost", resume=False, reporter=None,
                 trust=None, procs_id=None, rejoin=False, host_rank=0):
        """`resume`: continue from the newest snapshot (True, or that Snapshot, its files
        parsed, when the caller found it already). `trust` (a `singa.comm.trust.JobTrust`): the
        keys of the job's tcp traffic (None, or the job's `cluster.trusted_network`: plain
        tcp). `procs_id`: this process's number (None: by registration); `rejoin`: it
        restarts that lost process of the running job (an elastic one). `host_rank`: its
        rank on its host: the job's `gpu` ids become those it takes (`device.of_process`)."""
        n = topology.nprocs(job.cluster)
        if procs_id is not None and procs_id >= n:
            raise ConfigError(f"-procs_id {procs_id}: job {job.name} runs {n} processes")
        if rejoin and procs_id not in topology.elastic_procs(job.cluster, job.max_restarts):
            raise ConfigError(f"-rejoin: process {procs_id} of job {job.name} is not restarted "
                              f"alone (servers, part of a worker group, or no max_restarts): "
                              f"only a whole job restarts it")
        self.procs_id, self.rejoin = procs_id, rejoin
        self.host_rank, self.conf_gpus = host_rank, list(job.gpu)
        job.gpu[:] = device.of_process(self.conf_gpus, host_rank)
        self.job = job
        self.trust = None if job.cluster.trusted_network else trust
        self.cluster_rt = cluster_rt
        self.job_id = cluster_rt.job_id
        self.host = host
        self.resume = resume
        self.reporter = reporter
        self.workspace = singa.resolve(job.cluster.workspace)
        self.folder = checkpoint.folder(self.workspace)
        self.signal = None          # SIGINT, SIGTERM, SIGHUP or SIGUSR1 received
        self.snapshot = False       # the signal asks for a snapshot before the job stops
        self.process = None         # the executors, once built
        self.stopped = threading.Event()    # set once the executors have stopped

    def on_signal(self, signum, frame=None):
        """SIGINT/SIGTERM/SIGHUP: the stub stops the executors (at their next message). SIGUSR1 (and
        SIGTERM inside a Slurm allocation, its preemption and time limit): every worker of
        the job stops a step or two later, group 0 after writing a snapshot there (so do
        `snapshot_signals`). Before the executors exist, the driver leaves at once. Repeats
        change nothing, but that of a `snapshot_signals` one stops the executors at once."""
        if self.signal:
            if self.signal in self.snapshot_signals and signum in self.snapshot_signals \
                    and self.process is not None:
                log.warning("%s again: stopping without waiting for the snapshot",
                            signal.Signals(signum).name)
                self.snapshot = False
                self.process.stub.stop()
            return
        self.signal = signum
        self.snapshot = signum == signal.SIGUSR1 or signum in self.snapshot_signals or (
            signum == signal.SIGTERM and "SLURM_JOB_ID" in os.environ)
        name = signal.Signals(signum).name
        if self.process is None:
            log.warning("%s: stopping", name)
            raise Stopped()
        if self.snapshot:
            log.warning("%s: a snapshot in a step or two, then the job stops", name)
            self.process.stub.request_snapshot()
        else:
            log.warning("%s: stopping", name)
            self.process.stub.stop()

    def stop_after_snapshot(self, step):
        """Have the job stop after a snapshot at `step` (or the next step no worker has
        passed), as SIGUSR1 asks; from any thread, once (a signal's stop stays as it is)."""
        if self.process is None or self.signal or self.snapshot:
            return
        self.snapshot = True
        log.info("Stopping after a snapshot at step %d, as asked", step)
        self.process.stub.request_snapshot(step)

    def run(self, test=False):
        """Hold the workspace, then train (or test) with the job's compute threads."""
        job = self.job
        job.id = self.job_id
        # SINGA passes num_openblas_threads (default 1) to openblas_set_num_threads; we
        # share the layers' work out over as many threads, BLAS at one (singa/device/threads.py)
        with threads.limit(job.num_openblas_threads), numerics.quiet_float_warnings():
            held = workspace.hold(self.workspace, self.job_id)
            try:
                for sub in (workspace.CHECKPOINT, workspace.VISUALIZATION):
                    os.makedirs(os.path.join(self.workspace, sub), exist_ok=True)
                if test:
                    self.log_gpus(self.register(f"{self.host}:0"))
                    return self.test()
                self.train()
            finally:
                self.cluster_rt.close()
                held.close()
                if self.reporter is not None:
                    self.reporter.close()

    # --- training -------------------------------------------------------------------------
    def train(self):
        stale = checkpoint.remove_stale_temporaries(self.folder)
        if stale:
            log.info("Removed %d temporary files of interrupted checkpoint writes", len(stale))
        found = self.resume if isinstance(self.resume, checkpoint.Snapshot) else None
        self.resume = bool(self.resume)     # the workers alone hold the parsed files, and briefly
        resume = resume_from(self.job, self.folder, found) if self.resume else None
        del found
        if not self.resume:
            steps = sorted({sw[0] for sw in map(checkpoint.parse_step_worker,
                                                os.listdir(self.folder)) if sw})
            if steps:
                log.warning("%s holds snapshots of an earlier run (steps %d to %d): this run "
                            "writes over those of the steps it reaches, and once it has one "
                            "a resume continues this run (%s continues from the newest "
                            "instead)", self.folder, steps[0], steps[-1], self.resume_hint)
            if not self.rejoin:     # a restarted process of a running job: its run goes on
                checkpoint.start_run(self.folder)
        cl, rt = self.job.cluster, self.cluster_rt
        transport, process = Transport(self.trust, self.job_id), None
        try:
            pid = rt.reserve_proc(self.procs_id)
            self.log_gpus(pid)
            if self.rejoin:
                log.info("Process %d rejoins job %d at step %d", pid, self.job_id, self.job.step)
            process = Process(self.job, Place(pid, topology.nprocs(cl), rt.proc_endpoint,
                                              transport, rt, self.rejoin, 3 * REGISTER_TIMEOUT),
                              resume, self.reporter)
            endpoint = f"{self.host}:0"
            if topology.nprocs(cl) > 1:     # frames over the largest the job sends: refused
                endpoint = transport.listen(self.host, 2 * process.largest_frame() + (1 << 20))
            self.register(endpoint, pid, self.rejoin)
            for other in range(topology.nprocs(cl)):    # a job runs whole or not at all
                rt.proc_endpoint(other, timeout=REGISTER_TIMEOUT)
        except BaseException:
            (transport if process is None else process).close()
            raise
        self.process = process
        del resume      # the workers hold the snapshot's parsed files only until they load them
        if process.train_graph is not None:
            path = os.path.join(self.workspace, workspace.VISUALIZATION, "train_net.json")
            with open(path, "w") as f:
                f.write(process.train_graph.to_json())
        # the local servers stop once every local server group has lost its workers (each
        # server group alone stops on its workers' farewells, or with them in one process),
        # unless their workers may come back (an elastic job: farewells alone)
        groups = {g for g, _ in topology.servers_of(cl, pid)}
        emptied = set()

        def on_empty(g):
            emptied.add(g)
            if emptied == groups:
                process.stub.stop_servers()
        for g in sorted(groups) if not process.stub.members.elastic else ():
            rt.watch_sgroup(g, lambda g=g: on_empty(g))
        failure = None
        try:
            if topology.nprocs(cl) > 1:
                rt.watch_procs(process.stub.report_lost, process.stub.report_back)
                process.watch_peers(self.on_peer_down)
                threading.Thread(target=self.watch_silence, args=(process.stub, pid),
                                 daemon=True, name="silence").start()
            process.route()
        except BaseException as e:     # the others name why (a full disk), not "was lost"
            failure = e if isinstance(e, SingaError) else f"{type(e).__name__}: {e}"
            raise
        finally:
            self.stopped.set()
            try:
                if topology.nprocs(cl) > 1:      # both before the connections drop
                    process.stub.farewell(self.mark_done(pid, failure))
            finally:
                process.close()

    def log_gpus(self, pid):
        """Say which GPUs process `pid` takes, when the conf names any."""
        if self.conf_gpus:
            ids = list(self.job.gpu)
            log.info("process %d takes GPU%s %s (host rank %d of gpu: %s)", pid,
                     "s" if len(ids) > 1 else "", ", ".join(map(str, ids)), self.host_rank,
                     self.conf_gpus)

    def mark_done(self, pid, failure):
        """Mark this process's end in the cluster runtime, and return the mark: "" for a
        normal end, the signal's name (a failure for the others, unless the job stops for a
        snapshot), or `failure`, the error it stopped on."""
        stopped_by = ""
        if self.signal and not self.snapshot:
            stopped_by = signal.Signals(self.signal).name
        elif failure is not None:
            stopped_by = failed_mark(failure)
        try:
            self.cluster_rt.proc_done(pid, stopped_by)
        except ClusterError as e:      # its farewell still tells the others
            log.warning("process %d could not mark its end in ZooKeeper: %s", pid, e)
        return stopped_by

    def on_peer_down(self, pid):
        """The connection to process `pid` has dropped for good: a loss to report unless it
        ended normally, as its farewell says (or, not heard, its proc-done mark when
        ZooKeeper answers); a failed or stopped end is reported as that."""
        stub = self.process.stub
        mark = stub.members.ended.get(pid)
        mark = self.cluster_rt.proc_mark(pid) if mark is None else mark.encode()
        if mark == b"":
            return
        text = lost_text(self.job_id, pid, self.cluster_rt.proc_address(pid), mark)
        if stub.report_lost(text, pid):
            log.warning("No connection to process %d at %s for %g s", pid,
                        self.cluster_rt.known_endpoints().get(pid, "?"), DOWN_GRACE)

    def watch_silence(self, stub, pid):
        """With ZooKeeper unreachable nothing reports a lost process: one that has heard no
        message for SILENCE_TIMEOUT seconds then gives up (a server whose workers died)."""
        while not self.stopped.wait(1):
            if not self.cluster_rt.connected and stub.silent_for() > SILENCE_TIMEOUT:
                stub.report_lost(silence_message(self.job_id, pid,
                                                 self.cluster_rt.known_endpoints()), None)
                return

    def register(self, endpoint, procs_id=None, rejoin=False):
        """This process's procs id, by registration in the cluster runtime with `endpoint`
        (as `procs_id` when reserved already; `rejoin`: a restart of it)."""
        pid = self.cluster_rt.register_proc(endpoint, os.getpid(), procs_id, rejoin)
        log.info("proc #%d -> %s (pid = %d)", pid, endpoint, os.getpid())
        return pid

    # --- -test ----------------------------------------------------------------------------
    def test(self):
        """-test (Driver::Test): load every param of the test net from `checkpoint_path`, run
        `test_steps`; returns {metric: value}."""
        job = self.job
        if job.test_steps <= 0:
            raise ConfigError(f"{job.name}: -test needs test_steps > 0")
        net, files = evaluation.loaded_test_net(job, "-test")
        path = os.path.join(self.workspace, workspace.VISUALIZATION, "test_net.json")
        with open(path, "w") as f:
            f.write(net.to_json())
        step = files[-1].step
        step = job.step if step is None else step
        log.info("Test @ step %d", step)
        try:
            with net.device.selected():
                evaluation.run(net, job_pb2.kTest, job.test_steps,
                               worker_class(job).test_one_batch)
        finally:
            net.close()
        metrics = {}
        for values in net.metrics(job_pb2.kTest).values():
            log.info("   %s", singa_log.format_metrics(values))
            metrics.update((k.lower(), float(v)) for k, v in values.items())
        if self.reporter is not None:
            self.reporter.metrics(0, step, "test", metrics)
        return metrics


def set_timeouts(env):
    """REGISTER_TIMEOUT and SILENCE_TIMEOUT from `env` where it sets them (positive seconds;
    ConfigError naming the variable otherwise)."""
    global REGISTER_TIMEOUT, SILENCE_TIMEOUT
    seconds = {}
    for name in ("SINGA_REGISTER_TIMEOUT", "SINGA_SILENCE_TIMEOUT"):
        text = env.get(name)
        if text is None:
            continue
        try:
            seconds[name] = float(text)
        except ValueError:
            seconds[name] = math.nan
        if not 0 < seconds[name] < math.inf:
            raise ConfigError(f"{name}={text}: must be a positive number of seconds")
    REGISTER_TIMEOUT = seconds.get("SINGA_REGISTER_TIMEOUT", REGISTER_TIMEOUT)
    SILENCE_TIMEOUT = seconds.get("SINGA_SILENCE_TIMEOUT", SILENCE_TIMEOUT)


def silence_message(job_id, pid, endpoints):
    """What process `pid` says when it gives up on the others of job `job_id` after
    SILENCE_TIMEOUT s without a message and without ZooKeeper, naming each at the endpoint
    it registered (`endpoints`: {procs id: "host:port"}, as this process learned them)."""
    others = ", ".join(f"process {p} at {e}" for p, e in sorted(endpoints.items()) if p != pid)
    return (f"ZooKeeper is unreachable and no message came for {SILENCE_TIMEOUT:.0f} s: the "
            f"other processes of job {job_id} ({others or 'their endpoints never learned'}) "
            f"are taken for lost")


if __name__ == "__main__":
    sys.exit(main())
