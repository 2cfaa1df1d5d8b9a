"""The test run leaves nothing behind: a server a test starts is stopped by pid and seen gone,
when its tests pass, fail or are interrupted (Ctrl-C), and one that ignores SIGTERM is killed."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import processes
import singa

HERE = os.path.dirname(os.path.abspath(__file__))

INNER = """
import time
from conftest import nothing_outlives_the_run, zk_server     # noqa: F401 (the fixtures)

def test_runs_until_interrupted(zk_server):
    print("ZooKeeper up", flush=True)
    time.sleep(120)
"""


def test_ctrl_c_mid_test_stops_the_runs_zookeeper(tmp_path):
    """A pytest run of the suite's own fixtures gets SIGINT (a Ctrl-C) while a test that uses
    the session's ZooKeeper runs: pytest's finalizers stop it by pid before the run exits."""
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    out = tmp_path / "inner.out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE),
                                                       singa.HOME]))
    with open(out, "w") as f:
        inner = subprocess.Popen([sys.executable, "-m", "pytest", "-s", "-q", "-p",
                                  "no:cacheprovider", "--rootdir", str(tmp_path), "--basetemp",
                                  str(tmp_path / "base"), str(tmp_path / "test_inner.py")],
                                 cwd=tmp_path, env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "ZooKeeper up" not in out.read_text():
            assert time.monotonic() < deadline and inner.poll() is None, out.read_text()
            time.sleep(0.1)
        pid = processes.pid_file(tmp_path / "base" / "zookeeper0" / "zookeeper.pid", 0)
        assert processes.alive(pid)
        inner.send_signal(signal.SIGINT)
        inner.wait(timeout=60)
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()
    assert "KeyboardInterrupt" in out.read_text(), out.read_text()
    assert not processes.alive(pid), out.read_text()


def test_a_server_that_ignores_sigterm_is_killed_and_waited_for():
    """A daemon (forked away: not our child) that ignores SIGTERM: stop_server sends SIGKILL
    after the grace period and returns once it is gone."""
    code = ("import os, signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "if os.fork(): os._exit(0)\n"          # the daemon's fork: its parent exits
            "print(os.getpid(), flush=True); os.close(1); time.sleep(120)\n")
    made = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, timeout=30)
    pid = processes.track(int(made.stdout), "a test daemon that ignores SIGTERM")
    assert processes.alive(pid)
    t = time.monotonic()
    processes.stop_server(pid, grace=1)
    took = time.monotonic() - t
    assert not processes.alive(pid) and 1 <= took < 5, took
    assert (pid, "a test daemon that ignores SIGTERM") not in processes.servers_left()
