"""singatool: job ids, hosts and the job list in ZooKeeper (SINGA's src/utils/tool.cc), and
what the bin/ scripts ask of a conf.

Exit codes: 0 ok, 1 bad arguments (usage printed), 2 runtime error (one-line message),
3 no ZooKeeper session within the time (waitzk).
"""
import functools
import glob
import os
import re
import socket
import sys

from google.protobuf import text_format

import singa
from singa.cluster.job_manager import JobManager
from singa.cluster.zk import ZKService, zookeeper_answers
from singa.comm.trust import ENV, JobTrust, new_secret
from singa.errors import SingaError
from singa.job.config import load_job, load_plain, load_singa_conf
from singa.job.topology import elastic_procs, nprocs
from singa.job.workspace import METRICS
from singa.log import format_metrics
from singa.watch import metrics

USAGE = """\
Usage: singatool <command> [args] [-confdir <dir>]
  getlogdir          print log_dir of singa.conf
  getzkhost          print zookeeper_host of singa.conf
  withzkhost HOSTS   print singa.conf with zookeeper_host HOSTS
  waitzk SECONDS [-local]
                     exit 0 once a session to singa.conf's ZooKeeper opens, 3 if none within
                     SECONDS (-local: at once where nothing listens); stdout says, once, what
                     it waits for when the first second has not been enough
  create             print a new unique job id (and make its node, guarded by the job's
                     secret, when $SINGA_JOB_SECRET is set)
  genhost [JOB_CONF] print the hosts of the job's processes, one per line
  list               list running jobs
  listall            list all jobs
  view ID            print the processes of job ID as host|pid
  procstate ID N     print where process N of job ID stands: running host|pid, done,
                     stopped (by a signal or a failure), lost, or over (the job has no
                     process left)
  progress ID        print job ID's latest train step and metrics (from its metrics.csv)
  remove ID          remove job ID's processes from ZooKeeper
  wait ID            return once job ID has had processes and has none left (done or lost),
                     or (exit 2) once the process that started the wait has ended
  removeall          remove all jobs from ZooKeeper
  cleanup            remove all of SINGA's data from ZooKeeper
  nprocs JOB_CONF    print how many processes the job runs
  jobname JOB_CONF   print the job's name
  maxrestarts JOB_CONF [-test]
                     print the job's max_restarts
  elastic JOB_CONF   print the processes restarted alone when lost (an asynchronous job with
                     max_restarts: cluster.elastic_procs), space-separated
  newsecret          print a new job secret (singa/comm/trust.py)
  freeport ADDRESS   print a TCP port free on ADDRESS
  -confdir <dir>     directory of singa.conf and hostfile (default $SINGA_HOME/conf)"""

# command -> number of arguments it takes (genhost: the job conf is optional)
ARITY = {"getlogdir": (0,), "getzkhost": (0,), "withzkhost": (1,), "waitzk": (1, 2),
         "create": (0,), "genhost": (0, 1), "list": (0,), "listall": (0,), "view": (1,), "procstate": (2,),
         "progress": (1,), "remove": (1,), "removeall": (0,), "cleanup": (0,), "wait": (1,),
         "nprocs": (1,), "jobname": (1,), "maxrestarts": (1, 2), "newsecret": (0,),
         "freeport": (1,), "elastic": (1,)}
# command -> the flag its optional second argument must be
FLAG = {"waitzk": "-local", "maxrestarts": "-test"}
# commands that read neither singa.conf nor ZooKeeper
ALONE = ("nprocs", "jobname", "maxrestarts", "newsecret", "freeport", "elastic")


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    confdir = os.path.join(singa.HOME, "conf")
    if "-confdir" in args:
        i = args.index("-confdir")
        if i + 1 >= len(args):
            return usage("-confdir needs a directory")
        confdir = args[i + 1]
        del args[i:i + 2]
    if not args or args[0] not in ARITY:
        return usage(f"unknown command {args[0]!r}" if args else None)
    cmd, rest = args[0], args[1:]
    if len(rest) not in ARITY[cmd]:
        return usage(f"{cmd}: wrong number of arguments")
    if cmd in ("view", "progress", "remove", "wait", "procstate") and not _is_number(rest[0]):
        return usage(f"{cmd}: job id must be a number, not {rest[0]!r}")
    if cmd == "procstate" and not _is_number(rest[1]):
        return usage(f"procstate: process id must be a number, not {rest[1]!r}")
    if cmd == "waitzk" and not _is_number(rest[0]):
        return usage(f"waitzk: seconds must be a number, not {rest[0]!r}")
    if len(rest) == 2 and cmd in FLAG and rest[1] != FLAG[cmd]:
        return usage(f"{cmd}: unknown argument {rest[1]!r}")
    try:
        return run_alone(cmd, rest) if cmd in ALONE else run(cmd, rest, confdir)
    except SingaError as e:
        print(f"singatool: {e}", file=sys.stderr)
        return 2


def _is_number(text):
    """Whether `text` is ASCII digits (str.isdigit takes '²', which int() refuses)."""
    return re.fullmatch(r"[0-9]+", text) is not None


def run_alone(cmd, rest):
    """The commands of ALONE; returns the exit status."""
    if cmd == "nprocs":
        print(nprocs(load_plain(rest[0]).cluster))
    elif cmd in ("jobname", "maxrestarts", "elastic"):
        job = load_job(rest[0], check_paths=False, check_layers=False, test="-test" in rest)
        if cmd == "elastic":
            print(" ".join(map(str, sorted(elastic_procs(job.cluster, job.max_restarts)))))
        else:
            print(job.name if cmd == "jobname" else job.max_restarts)
    elif cmd == "newsecret":
        print(new_secret())
    elif cmd == "freeport":
        print(free_port(rest[0]))
    return 0


def run(cmd, rest, confdir):
    """The commands that read singa.conf; returns the exit status."""
    conf = load_singa_conf(os.path.join(confdir, "singa.conf"))
    if cmd == "getlogdir":
        print(conf.log_dir.rstrip("/") or "/")
        return 0
    if cmd == "getzkhost":
        print(conf.zookeeper_host)
        return 0
    if cmd == "withzkhost":
        conf.zookeeper_host = rest[0]
        print(text_format.MessageToString(conf), end="")
        return 0
    if cmd == "waitzk":
        answers = zookeeper_answers(conf.zookeeper_host, int(rest[0]),
                                    wait_refused="-local" not in rest,
                                    waiting=functools.partial(print, flush=True))
        return 0 if answers else 3
    if cmd == "progress":
        print("\n".join(progress(int(rest[0]), conf.log_dir)))
        return 0
    n = nprocs(load_plain(rest[0]).cluster) if cmd == "genhost" and rest else 1
    trust = JobTrust.from_env()
    with ZKService(conf.zookeeper_host, trust=trust) as service:
        jobs = JobManager(service)
        if cmd == "create":
            print(jobs.new_job_id(trust))
        elif cmd == "genhost":
            print("\n".join(jobs.gen_hosts(os.path.join(confdir, "hostfile"), n)))
        elif cmd in ("list", "listall"):
            listed = jobs.list_jobs(all=cmd == "listall")
            columns = [("JOB ID", {j: j for j, _ in listed}), ("NUM PROCS", dict(listed))]
            slurm = {job_id: slurm_job(job_id, conf.log_dir) for job_id, _ in listed}
            if any(slurm.values()):     # jobs of bin/singa-sbatch.sh: Slurm's id beside ours
                columns.append(("SLURM JOB", slurm))
            restarts = {job_id: len(job_info(job_id, conf.log_dir, "restarts").splitlines())
                        for job_id, _ in listed}
            if any(restarts.values()):  # processes bin/singa-run.sh restarted alone
                columns.append(("RESTARTS", restarts))
            alone = {job_id: unsupervised(job_id, conf.log_dir) for job_id, _ in listed}
            if any(alone.values()):     # its launcher was killed: singa-console.sh kill stops it
                columns.append(("UNSUPERVISED", alone))
            if len(columns) == 2:       # SINGA's own lines
                print("JOB ID    |NUM PROCS  \n----------|-----------")
                for job_id, n in listed:
                    print("%-10d|%-10d" % (job_id, n))
            else:                       # ours: the last column unpadded
                print("|".join(f"{title:<10}" for title, _ in columns).rstrip())
                print("|".join("-" * 10 for _ in columns))
                for job_id, _ in listed:
                    print("|".join(f"{values[job_id]!s:<10}" for _, values in columns).rstrip())
        elif cmd == "wait":
            # the launcher that asked is gone (its end kills this wait; a SIGKILL cannot):
            # nobody waits for the answer, so neither does this process
            launcher = os.getppid()
            if not jobs.wait_ended(int(rest[0]), given_up=lambda: os.getppid() != launcher):
                raise SingaError(f"wait: stopped waiting for job {rest[0]}: the process that "
                                 f"started the wait (pid {launcher}) has ended")
        elif cmd == "procstate":
            print(jobs.proc_state(int(rest[0]), int(rest[1])))
        elif cmd == "view":
            for proc in jobs.job_procs(int(rest[0])):
                print(proc)
        elif cmd in ("remove", "removeall", "cleanup"):
            left = jobs.remove_job(int(rest[0])) if cmd == "remove" else \
                jobs.remove_all() if cmd == "removeall" else jobs.cleanup()
            if left:
                print(f"singatool: {cmd}: {len(left)} nodes left, which belong to jobs whose "
                      f"secret {ENV} does not hold (e.g. {left[0]})", file=sys.stderr)
    return 0


def free_port(address):
    """A TCP port that nothing listens on at `address` now (a server's, to be bound soon)."""
    with socket.socket() as s:
        try:
            s.bind((address, 0))
        except OSError as e:
            raise SingaError(f"freeport: cannot bind to {address}: {e.strerror}") from None
        return s.getsockname()[1]


def job_info(job_id, log_dir, name):
    """The text of file `name` (at most 64 KiB) in job `job_id`'s newest
    `<log_dir>/job-info/job-<id>-<time>/` (bin/singa-run.sh's), else ""."""
    infos = sorted(glob.glob(os.path.join(glob.escape(log_dir), "job-info", f"job-{job_id}-*")))
    try:
        with open(os.path.join(infos[-1], name), errors="replace") as f:
            return f.read(1 << 16)
    except (IndexError, OSError):
        return ""


def unsupervised(job_id, log_dir):
    """"yes" when job `job_id`'s bin/singa-run.sh (its `launcher` file: "<host> <pid>") ran on
    this host and has ended while the job is listed (a `kill -9` of it): nothing restarts the
    job's processes or stops them together then; else ""."""
    words = job_info(job_id, log_dir, "launcher").split()
    if len(words) != 2 or words[0] != socket.gethostname() or not _is_number(words[1]):
        return ""
    try:
        os.kill(int(words[1]), 0)
    except ProcessLookupError:
        return "yes"
    except (PermissionError, OverflowError):
        pass
    return ""


def slurm_job(job_id, log_dir):
    """The Slurm job id of job `job_id` (what bin/singa-run.sh keeps in `slurm.job` of its job
    information inside an allocation), else ""."""
    value = job_info(job_id, log_dir, "slurm.job").strip()
    return value if re.fullmatch(r"[\w.+-]{1,64}", value) else ""


def progress(job_id, log_dir):
    """Lines of job `job_id`'s latest train display and test/validation, read from the
    metrics.csv of the workspace its conf names (the copy singa-run.sh keeps in
    `<log_dir>/job-info/job-<id>-<time>/job.conf`)."""
    infos = sorted(glob.glob(os.path.join(glob.escape(log_dir), "job-info", f"job-{job_id}-*",
                                          "job.conf")))
    if not infos:
        return [f"job {job_id}: no job information in {os.path.join(log_dir, 'job-info')}"]
    job = load_plain(infos[-1])
    train_steps = job.train_steps
    path = os.path.join(singa.resolve(job.cluster.workspace), METRICS)
    last = {}
    for row in metrics.read_rows(path, job_id):
        if row["group"] == 0:
            step, values = last.get(row["phase"], (None, {}))
            if step != row["step"]:
                values = {}
            values[row["metric"]] = row["value"]
            last[row["phase"]] = (row["step"], values)
    if not last:
        return [f"job {job_id}: no metrics yet in {path}"]
    lines = []
    for phase in metrics.PHASES:
        if phase in last:
            step, values = last[phase]
            of = f" of {train_steps}" if phase == "train" and train_steps else ""
            lines.append(f"{phase.capitalize()} @ step {step}{of}  {format_metrics(values)}")
    return lines


def usage(problem=None):
    if problem:
        print(f"singatool: {problem}", file=sys.stderr)
    print(USAGE, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
