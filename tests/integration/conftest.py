"""Fixtures of the integration tests: a real ZooKeeper server and a singa.conf pointing at it."""
import os
import socket
import subprocess

import pytest

import singa

ZK_SERVICE = os.path.join(singa.HOME, "bin", "zk-service.sh")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    """A ZooKeeper server of its own (bin/zk-service.sh, free port, tmp data); yields "127.0.0.1:<port>"."""
    port = free_port()
    env = dict(os.environ, ZK_PORT=str(port), ZK_DATA=str(tmp_path_factory.mktemp("zookeeper")),
               SINGA_MANAGES_ZK="true")
    started = subprocess.run(["bash", ZK_SERVICE, "start"], env=env, capture_output=True, text=True)
    if started.returncode != 0:
        pytest.fail(f"zk-service.sh start failed: {started.stderr.strip()}", pytrace=False)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", ZK_SERVICE, "stop"], env=env, capture_output=True)


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
