"""Time-outs name the silent peer: its process, host and port, as this process learned them
(with ZooKeeper away too)."""
import re

import numpy as np
import pytest
import zmq

from singa.cluster.cluster_rt import ClusterRuntime
from singa.comm import msg as m
from singa.comm.socket import Dealer, Router
from singa.driver import silence_message
from singa.errors import ClusterError
from singa.proto import job_pb2
from singa.train.place import Place
from singa.train.runtime import Process
from test_bridge import channel
from test_runtime import make_job


class AwayRuntime(ClusterRuntime):
    """A cluster runtime that learned the endpoints `known` at start-up and whose ZooKeeper is
    now away."""

    def __init__(self, known):
        self.known = known

    def proc_endpoint(self, procs_id, timeout=None):
        if procs_id in self.known:
            return self.known[procs_id]
        raise ClusterError(f"ZooKeeper at zk:2181 did not answer within {timeout:g} s "
                           f"(stat proc-{procs_id})")

    def known_endpoints(self):
        return dict(self.known)


class Bridge:
    def __init__(self, name, partition_id, peer=None):
        self.name, self.partition_id, self.peer = name, partition_id, peer


def test_a_bridge_time_out_names_the_peer_workers_process_host_and_port():
    ctx = zmq.Context()
    router = Router(ctx, "inproc://test-timeouts")
    dealer = Dealer(m.addr(0, 0, m.kWorkerParam), router.endpoint)
    chan = channel(router.endpoint, 0, 0, dealer, lambda msg: None, 0.2,
                   where=lambda peer: f"process {peer + 2} at 10.0.0.9:40{peer}")
    src = Bridge("bridge_src(a@0->b@1)", 0, Bridge("bridge_dst(a@0->b@1)", 1))
    try:
        with pytest.raises(ClusterError) as e:
            chan.receive(src, job_pb2.kBackward, np.zeros(3, np.float32))
        assert str(e.value) == ("worker (0, 0): no gradient for layer 'bridge_src(a@0->b@1)' "
                                "from worker (0, 1) (process 3 at 10.0.0.9:401) in 0 s")
    finally:
        for x in (chan, dealer, router):
            x.close()
        ctx.term()


def test_a_workers_time_out_names_its_servers_from_what_it_learned(tmp_path):
    """ZooKeeper away: the servers' process is named at the endpoint learned at start-up; a
    process never learned says so, with ZooKeeper's own error."""
    process = Process(make_job(tmp_path, nservers_per_group=2, nservers_per_procs=2))
    try:
        worker = process.workers[0]
        worker.response_timeout = 0.2
        # as if process 0 of three
        worker.place = Place(0, 3, cluster_rt=AwayRuntime({0: "10.0.0.7:5000"}))
        with pytest.raises(ClusterError, match=r"^worker \(0, 0\): no answer for the test from "
                           r"its servers \(process 0 at 10\.0\.0\.7:5000\) in 0 s$"):
            worker.wait(lambda: False, "the test")
        worker.place = Place(0, 3, cluster_rt=AwayRuntime({}))
        assert re.fullmatch(r"process 0 at an endpoint this process never learned \(ZooKeeper "
                            r"at zk:2181 did not answer within 1 s \(stat proc-0\)\)",
                            worker.servers_where()), worker.servers_where()
        assert worker.worker_where(0) == "process 0 at an endpoint this process never " \
            "learned (ZooKeeper at zk:2181 did not answer within 1 s (stat proc-0))"
    finally:
        process.close()


def test_the_silence_message_names_every_other_process_at_its_endpoint():
    text = silence_message(12, 1, {0: "10.0.0.1:5000", 1: "10.0.0.2:5001", 2: "10.0.0.3:5002"})
    assert text == ("ZooKeeper is unreachable and no message came for 60 s: the other processes "
                    "of job 12 (process 0 at 10.0.0.1:5000, process 2 at 10.0.0.3:5002) are "
                    "taken for lost")
    assert "(their endpoints never learned)" in silence_message(12, 0, {0: "10.0.0.1:5000"})
