"""Processes the tests start and must not leave behind: servers (ZooKeeper, sshd, munged,
slurmctld, slurmd) kept by pid from their start until stopped and seen gone, and a scan of
/proc for what is left of a launch.

A server is `track`ed as it starts and `stop`ped by its fixture (SIGTERM, SIGKILL after a grace
period, then waited for: a server that daemonized is not our child, so "gone" is read from
/proc). conftest's session fixture checks at the end of the run that no tracked server is left,
nor any process that names the run's temporary folder (`mentioning`), and an atexit guard stops
tracked servers still running (a run interrupted before its finalizers ran)."""
import atexit
import os
import signal
import time

_servers = {}       # pid -> (its start time, what it is)


def start_time(pid):
    """The start time of process `pid` (clock ticks since boot), or None when it is gone or a
    zombie: with the pid, it names one process (a pid may be reused)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def alive(pid, started=None):
    """True while process `pid` runs (and, given `started`, is the one that started then)."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def stop(pids, grace=10.0):
    """SIGTERM to each process of `pids` still running, SIGKILL to those running `grace` s
    later; returns once all are gone (a list of those still there 10 s after SIGKILL)."""
    started = {pid: start_time(pid) for pid in pids}
    running = [pid for pid, t in started.items() if t is not None]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for pid in running:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while True:     # a zombie counts as gone (a Popen's owner reaps it)
            running = [pid for pid in running if alive(pid, started[pid])]
            if not running or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if not running:
            break
    return running


def track(pid, what):
    """Keep server `pid` (`what`: a line naming it) until `stop_server`; returns pid."""
    started = start_time(pid)
    if started is not None:
        _servers[pid] = (started, what)
    return pid


def pid_file(path, timeout=10.0):
    """The pid a server wrote to `path` (a daemon writes it just after it forks: waited for)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                text = f.read().strip()
            if text.isdigit():
                return int(text)
        except FileNotFoundError:
            pass
        if time.monotonic() >= deadline:
            raise AssertionError(f"no pid in {path} {timeout:g} s after the server started")
        time.sleep(0.05)


def stop_server(pid, grace=10.0):
    """Stop tracked server `pid` (SIGTERM, SIGKILL after `grace` s) and forget it once gone."""
    started, what = _servers.get(pid, (None, str(pid)))
    if started is not None and alive(pid, started):
        left = stop([pid], grace)
        assert not left, f"{what} (pid {pid}) still runs 10 s after SIGKILL"
    _servers.pop(pid, None)


def servers_left():
    """[(pid, what)] of the tracked servers still running."""
    return [(pid, what) for pid, (started, what) in _servers.items() if alive(pid, started)]


@atexit.register
def stop_servers():
    """Stop every tracked server still running (the guard of an interrupted run)."""
    for pid, _ in servers_left():
        stop([pid], 5.0)
        _servers.pop(pid, None)


def mentioning(*markers):
    """[(pid, command line)] of running processes, other than this one, whose command line or
    environment holds one of `markers` (e.g. a test's temporary folder)."""
    found = []
    needles = [m.encode() for m in markers]
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid() or start_time(name) is None:
            continue
        text = b""
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{name}/{part}", "rb") as f:
                    text += f.read() + b"\0"
            except OSError:     # gone meanwhile, or not ours to read
                pass
        if any(n in text for n in needles):
            found.append((int(name), _cmdline(name)))
    return found


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
