"""A job's workspace: its layout (what a job keeps under it, named here alone), and the job's
hold on it, an OS lock (flock) that ends with the process holding it.

Every process of a job holds `<workspace>/.singa-job` shared; its content names the job that
claimed it (`job <id> pid <pid> host <host>`). A process of another job finds it held and is
refused. `.singa-lock` is held exclusively for the moment a process checks and claims, so the
claim (an exclusive lock turned shared) is never seen half done.
"""
import fcntl
import os
import socket
import time

from singa.errors import ConfigError

# The layout (bin/singa-cleanup.sh and the examples' .gitignore spell some of these names too)
CHECKPOINT = "checkpoint"          # snapshots: step<N>-worker<W>.bin and their .meta
VISUALIZATION = "visualization"    # SINGA's train_net.json and test_net.json
METRICS = "metrics.csv"            # a row per metric of each display, test and validation
TENSORBOARD = "tensorboard"        # TensorBoard's event files, a folder per run
DATA = "data"                      # data written as kvfiles: the Python API's, a Caffe import's
RUN_CONF = "run.conf"              # the job conf a Python session ran
LOG = "{name}.log"                 # a Python session's log of job `name`
CONF = "conf"                      # singa.conf and hostfile of a session's job of several processes
JOB_CONF = "job.conf"              # the job conf bin/singa-import.sh writes
CURVES = "curves.png"              # bin/singa-plot.sh's figure, unless told another
MUTEX = ".singa-lock"
HOLDER = ".singa-job"


def make(workspace, parents=False):
    """Make the folder `workspace` if missing (and its missing parents with `parents`: the
    Python API's rule; the conf check wants the parent there), as the job's other processes
    may at the same moment; ConfigError naming it."""
    try:
        if parents:
            os.makedirs(workspace, exist_ok=True)
        elif not os.path.isdir(workspace):
            os.mkdir(workspace)
    except FileExistsError:
        pass
    except OSError as e:
        raise ConfigError(f"cannot make the workspace {workspace}: {e.strerror}") from None


def hold(workspace, job_id, wait=10.0):
    """Hold `workspace` for job `job_id` until the returned file is closed or this process ends
    (the folder made first if missing).

    ConfigError when a process of another job holds it, naming that job.
    """
    make(workspace)
    mutex = _open(workspace, MUTEX)
    try:
        _lock_within(mutex, wait, workspace)
        f = _open(workspace, HOLDER)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:     # held: by this job's other processes, or by another job
            holder = f.read().strip()
            if holder.split()[:2] != ["job", str(job_id)]:
                f.close()
                words = holder.split()
                how = f" (bin/singa-console.sh kill {words[1]})" if words[:1] == ["job"] and \
                    len(words) > 1 and words[1].isdigit() else ""
                raise ConfigError(f"workspace {workspace} is in use by {_describe(holder)}; "
                                  f"stop that job{how} or give this one another workspace") \
                    from None
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return f
        f.seek(0)
        f.truncate()
        f.write(f"job {job_id} pid {os.getpid()} host {socket.gethostname()}\n")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_SH)   # share it with the job's other processes
        return f
    finally:
        mutex.close()


def _open(workspace, name):
    try:
        return open(os.open(os.path.join(workspace, name), os.O_RDWR | os.O_CREAT, 0o644),
                    "r+", encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConfigError(f"workspace {workspace}: cannot lock {name} ({e.strerror})") from None


def _lock_within(f, wait, workspace):
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise ConfigError(f"workspace {workspace}: {MUTEX} stayed locked for {wait:g} s "
                                  f"(a process stuck while it took the workspace?)") from None
            time.sleep(0.01)


def _describe(holder):
    """'job 7 (pid 12 on host h)' from the holder line, or the line itself if it is not one."""
    words = holder.split()
    if len(words) == 6 and words[0] == "job" and words[2] == "pid" and words[4] == "host":
        return f"job {words[1]} (pid {words[3]} on host {words[5]})"
    return f"another job ({holder[:80]!r} in {HOLDER})"
