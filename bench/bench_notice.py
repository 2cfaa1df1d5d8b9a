"""Time to notice a lost process: a real ZooKeeper, real 3-process jobs (SINGA's fixture MLP,
Downpour: two worker groups and their server group, each in a process), one process killed
(SIGKILL, or frozen: `--signal STOP`) per job, from the signal to the survivors' loss report
(the stub's `... was lost; stopping` line, its time stamp; the later of the two survivors).
Two sides, in interleaved rounds: ours (a dropped connection, `singa.comm.liveness`) and the
reference, ZooKeeper alone (the same driver with the connection watch's grace made infinite:
a lost process is noticed when its session ends, `zk.SESSION_TIMEOUT`). The victim turns
round the processes.

    .venv/bin/python bench/bench_notice.py [--kills 10] [--load 0] [--calm 30] [--signal KILL]

`--load N` runs N CPU-burning processes during the whole measurement, and first a job that
nobody kills for `--calm` s under that load: no process may report another lost (a false
alarm). Needs Debian's zookeeper (bin/zk-service.sh) and writes under a temporary folder.

    .venv/bin/python bench/bench_notice.py --rejoin [--kills 3] [--freeze 5]

`--rejoin` (issue 46): the same job elastic (max_restarts 1, a snapshot every 1,000 steps), one
worker process stopped cleanly per job, SIGTERM, then a freeze of `--freeze` s (SIGSTOP, then
SIGCONT), the bench restarting it with -rejoin once it has exited (as bin/singa-run.sh does):
seconds from the signal to the server process's `Process N rejoined the job` line, and the
steps the job trained meanwhile without its group (its `leave at step` and `rejoined ... at
step` lines); a process that does not rejoin within REJOIN_WAIT s is counted so.
"""
import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HOME)
from singa.cluster.job_manager import JobManager  # noqa: E402
from singa.cluster.zk import ZKService  # noqa: E402
from singa.comm.trust import ENV, JobTrust, new_secret  # noqa: E402

from bench_startup import fixture_job  # noqa: E402

DRIVER = {"ours": "from singa.driver import main",
          "ZooKeeper only": "import math, singa.comm.liveness as l\nl.DOWN_GRACE = math.inf\n"
                            "from singa.driver import main"}
REPORT = re.compile(r"^E(\d{4} \d\d:\d\d:\d\d\.\d{6}) .*\] (process \d+ of job \d+ .*); stopping$",
                    re.M)
LEFT = re.compile(r"^W\S+ \S+ .*\] process (\d+) of job .*: its worker groups leave at step (\d+)",
                  re.M)
REJOINED = re.compile(r"^I(\d{4} \d\d:\d\d:\d\d\.\d{6}) .*\] Process (\d+) rejoined the job at "
                      r"step (\d+)", re.M)
#: seconds a stopped process may take to rejoin (the survivors wait 60 s, then stop)
REJOIN_WAIT = 75


def job_conf(folder, elastic=False):
    """The fixture MLP as a Downpour job of 3 processes that trains until it is killed;
    `elastic`: its worker processes restart alone (max_restarts 1, a snapshot every 1,000
    steps to resume from)."""
    path = fixture_job(folder, (("train_steps: 200", "train_steps: 10000000"),
                                ("test_freq: 100", "test_freq: 0"),
                                ("checkpoint_freq: 100",
                                 f"checkpoint_freq: {1000 if elastic else 0}"),
                                ("disp_freq: 20", "disp_freq: 50"),
                                ("cluster { nworker_groups: 1",
                                 "cluster { server_worker_separate: true nworker_groups: 2")))
    if elastic:
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write("max_restarts: 1\n" + text)
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ZooKeeper:
    """bin/zk-service.sh's server on a free port, data under `folder`, while open."""

    def __init__(self, folder):
        self.env = dict(os.environ, ZK_PORT=str(free_port()), ZK_DATA=os.path.join(folder, "zk"),
                        SINGA_MANAGES_ZK="true")
        self.hosts = f"127.0.0.1:{self.env['ZK_PORT']}"

    def __enter__(self):
        subprocess.run(["bash", os.path.join(HOME, "bin", "zk-service.sh"), "start"], env=self.env,
                       check=True, capture_output=True)
        return self

    def __exit__(self, *exc):
        subprocess.run(["bash", os.path.join(HOME, "bin", "zk-service.sh"), "stop"], env=self.env,
                       capture_output=True)


class Job:
    """The 3 driver processes of a new job (`side`'s driver), logging to files in `folder`."""

    def __init__(self, side, conf, singa_conf, zk, folder):
        secret = new_secret()
        trust = JobTrust(secret)
        with ZKService(zk.hosts, trust=trust) as session:
            self.id = JobManager(session).new_job_id(trust)
        env = dict(os.environ, **{ENV: secret})
        self.logs = [os.path.join(folder, f"job{self.id}-{i}.log") for i in range(3)]
        code = DRIVER[side] + "\nimport sys\nsys.exit(main(sys.argv[1:]))"
        self.command = [sys.executable, "-c", code, "-conf", conf, "-singa_conf", singa_conf,
                        "-singa_job", str(self.id)]
        self.env, self.procs = env, []
        for i in range(3):
            self.procs.append(self.start(i, self.command))

    def start(self, i, command):
        with open(self.logs[i], "a") as out:
            return subprocess.Popen(command, cwd=HOME, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT)

    def rejoin(self, i, pid):
        """Restart process `pid` (started `i`-th) with -rejoin, its log after the old one's."""
        self.procs[i] = self.start(i, self.command + ["-procs_id", str(pid), "-rejoin"])

    def texts(self):
        return [open(log).read() for log in self.logs]

    def wait_training(self, timeout=300):
        """Until every process runs its stub and a worker is past step 50; {procs id: index
        in start order}."""
        deadline = time.monotonic() + timeout
        while True:
            texts = self.texts()
            if all("Stub in process starts" in t for t in texts) and \
                    any("Train @ step 50 " in t for t in texts):
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.close()
                sys.exit("the job did not start:\n" + "\n".join(t[-2000:] for t in texts))
            time.sleep(0.05)
        return {int(re.search(r"proc #(\d+) ->", t)[1]): i for i, t in enumerate(texts)}

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def stamp(text):
    """Seconds since the epoch of a log line's `mmdd hh:mm:ss.uuuuuu` (this year, local)."""
    t = time.strptime(f"{time.localtime().tm_year} {text[:-7]}", "%Y %m%d %H:%M:%S")
    return time.mktime(t) + int(text[-6:]) / 1e6


def kill_one(side, victim, sig, conf, singa_conf, zk, folder):
    """Seconds from signal `sig` to process `victim` to the later survivor's loss report (the
    victim is killed once the survivors have ended)."""
    job = Job(side, conf, singa_conf, zk, folder)
    try:
        index = job.wait_training()
        time.sleep(0.5)
        job.procs[index[victim]].send_signal(sig)
        killed = time.time()
        for i in index.values():
            if i != index[victim]:
                job.procs[i].wait(timeout=120)
    finally:
        job.close()
    noticed, texts = [], job.texts()
    for pid, i in sorted(index.items()):
        if pid == victim:
            continue
        report = REPORT.search(texts[i])
        if report is None:
            sys.exit(f"process {pid} of job {job.id} reported no loss:\n{texts[i][-2000:]}")
        noticed.append(stamp(report[1]) - killed)
    return max(noticed)


def stop_one(how, freeze, victim, conf, singa_conf, zk, folder):
    """Stop worker process `victim` of an elastic job (`how`: "TERM", or "STOP" for `freeze`
    s), restart it with -rejoin once it has exited; (seconds from the signal to the server
    process's line that it rejoined, steps the job trained without it), or None when it did
    not rejoin within REJOIN_WAIT s."""
    job = Job("ours", conf, singa_conf, zk, folder)
    try:
        index = job.wait_training()
        time.sleep(0.5)
        proc = job.procs[index[victim]]
        if how == "STOP":
            proc.send_signal(signal.SIGSTOP)
            stopped = time.time()
            time.sleep(freeze)
            proc.send_signal(signal.SIGCONT)
        else:
            proc.send_signal(signal.SIGTERM)
            stopped = time.time()
        server = index[2]
        deadline, restarted = stopped + REJOIN_WAIT, False
        while time.time() < deadline and job.procs[server].poll() is None:
            if not restarted and proc.poll() is not None:    # exited: restart it alone
                job.rejoin(index[victim], victim)
                restarted = True
            rejoined = REJOINED.search(job.texts()[server])
            if rejoined:
                left = LEFT.search(job.texts()[server])
                return stamp(rejoined[1]) - stopped, int(rejoined[3]) - int(left[2])
            time.sleep(0.1)
        return None
    finally:
        job.close()


def calm(seconds, conf, singa_conf, zk, folder):
    """Lines of a job nobody kills, after `seconds` of training, that report a loss."""
    job = Job("ours", conf, singa_conf, zk, folder)
    try:
        job.wait_training()
        time.sleep(seconds)
        texts = job.texts()
        alive = all(p.poll() is None for p in job.procs)
    finally:
        job.close()
    alarms = [line for t in texts for line in t.splitlines()
              if "was lost" in line or "No connection" in line or "failed" in line]
    return alarms if alive else alarms + ["a process ended by itself"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=10, help="jobs killed per side")
    ap.add_argument("--load", type=int, default=0, help="CPU-burning processes meanwhile")
    ap.add_argument("--calm", type=float, default=30.0,
                    help="seconds of an unkilled job under --load (false alarms)")
    ap.add_argument("--signal", default="KILL", choices=["KILL", "STOP"],
                    help="SIGKILL, or SIGSTOP (a frozen process)")
    ap.add_argument("--rejoin", action="store_true",
                    help="an elastic job: time to rejoin after SIGTERM and after a freeze")
    ap.add_argument("--freeze", type=float, default=5.0, help="seconds of the --rejoin freeze")
    args = ap.parse_args()
    if args.rejoin:
        return rejoins(args.kills, args.freeze)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(args.load)]
    try:
        with tempfile.TemporaryDirectory() as folder, ZooKeeper(folder) as zk:
            conf = job_conf(folder)
            singa_conf = os.path.join(folder, "singa.conf")
            with open(singa_conf, "w") as f:
                f.write(f'zookeeper_host: "{zk.hosts}"\nlog_dir: "{folder}/log/"\n')
            if args.load:
                alarms = calm(args.calm, conf, singa_conf, zk, folder)
                print(f"no kill, {args.calm:g} s at load {args.load}: "
                      f"{len(alarms)} false alarms" + "".join(f"\n  {a}" for a in alarms))
            times = {side: [] for side in DRIVER}
            for i in range(args.kills):
                for side in DRIVER:
                    times[side].append(kill_one(side, i % 3, signal.Signals["SIG" + args.signal],
                                                conf, singa_conf, zk, folder))
                    print(f"SIG{args.signal} {i + 1:2d} to process {i % 3}, {side:15s}: "
                          f"{times[side][-1]:5.2f} s", flush=True)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    print(f"\n{os.cpu_count()} cpus, load {args.load} (+ the job's 3 processes), "
          f"{args.kills} jobs per side, SIG{args.signal} to one process of each")
    print(f"{'signal to the survivors report':32s} {'median s':>9s} {'max s':>7s} {'min s':>7s}")
    for side, t in times.items():
        print(f"{side:32s} {statistics.median(t):9.2f} {max(t):7.2f} {min(t):7.2f}")
    ours, zk = (statistics.median(t) for t in times.values())
    print(f"ours / ZooKeeper only (medians): {ours / zk:.2f}; target: ours within 5 s, max "
          f"{max(times['ours']):.2f} s")


def rejoins(kills, freeze):
    """`--rejoin`: `kills` jobs per way of stopping, the victim turning round the two worker
    processes; a row per way."""
    ways = {"SIGTERM": ("TERM", 0), f"SIGSTOP {freeze:g} s, SIGCONT": ("STOP", freeze)}
    results = {way: [] for way in ways}
    with tempfile.TemporaryDirectory() as folder, ZooKeeper(folder) as zk:
        conf = job_conf(folder, elastic=True)
        singa_conf = os.path.join(folder, "singa.conf")
        with open(singa_conf, "w") as f:
            f.write(f'zookeeper_host: "{zk.hosts}"\nlog_dir: "{folder}/log/"\n')
        for i in range(kills):
            for way, (how, seconds) in ways.items():
                got = stop_one(how, seconds, i % 2, conf, singa_conf, zk, folder)
                results[way].append(got)
                print(f"{way} {i + 1:2d} to process {i % 2}: " + (
                    f"rejoined after {got[0]:5.2f} s, {got[1]} steps without it" if got
                    else f"not rejoined within {REJOIN_WAIT} s"), flush=True)
    print(f"\n{os.cpu_count()} cpus, {kills} jobs per row, one worker process of each stopped")
    print(f"{'stop to rejoin':26s} {'median s':>9s} {'max s':>7s} {'steps without it':>17s} "
          f"{'not rejoined':>13s}")
    for way, got in results.items():
        ok = [g for g in got if g is not None]
        times = f"{statistics.median(t for t, _ in ok):9.2f} {max(t for t, _ in ok):7.2f}" \
            if ok else f"{'-':>9s} {'-':>7s}"
        steps = f"{statistics.median(n for _, n in ok):17.0f}" if ok else f"{'-':>17s}"
        print(f"{way:26s} {times} {steps} {len(got) - len(ok):13d}")


if __name__ == "__main__":
    main()
