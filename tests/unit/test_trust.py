"""singa.comm.trust and CURVE on real sockets: keys derive from the job's secret alone, only a peer
holding the job's keys gets a message through, and a frame over the bound is refused."""
import numpy as np
import pytest
import zmq

from singa.comm import msg as m
from singa.comm.trust import JobTrust, new_secret
from singa.errors import ClusterError, ConfigError
from singa.train.runtime import Transport


def test_keys_and_acl_come_from_the_secret_alone():
    secret = new_secret()
    a, b, other = JobTrust(secret), JobTrust(secret), JobTrust(new_secret())
    assert (a.server_public, a.client_secret, a.zk_auth) == \
        (b.server_public, b.client_secret, b.zk_auth)
    assert len({a.server_public, a.client_public, other.server_public, other.client_public}) == 4
    assert zmq.curve_public(a.server_secret) == a.server_public
    assert a.owns(a.zk_acl) and not a.owns(other.zk_acl)
    assert [acl.perms for acl in a.zk_acl] == [31, 1]          # the job: all; anyone: read


@pytest.mark.parametrize("bad", ["", "x" * 64, "ab" * 31, "AB" * 32],
                         ids=["empty", "not-hex", "short", "upper-case"])
def test_a_malformed_secret_is_one_line(bad):
    with pytest.raises(ConfigError, match="SINGA_JOB_SECRET: not a job secret"):
        JobTrust(bad)


@pytest.fixture
def listening():
    """A Transport of a job's trust listening on loopback, frames up to 64 KiB."""
    trust = JobTrust(new_secret())
    transport = Transport(trust)
    endpoint = transport.listen("127.0.0.1", 1 << 16)
    yield transport, endpoint, trust
    transport.close()


def dealer(ctx, endpoint, server_key=None, keypair=None):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if server_key is not None:
        sock.curve_serverkey = server_key
        sock.curve_publickey, sock.curve_secretkey = keypair
    sock.connect("tcp://" + endpoint)
    return sock


def forged(text):
    return [m.Msg(m.addr(0, 0, m.kWorkerParam), m.STUB, m.kStop).header(), text]


def test_only_a_peer_with_the_jobs_keys_gets_through(listening):
    transport, endpoint, trust = listening
    ctx = zmq.Context()
    try:
        strangers = [dealer(ctx, endpoint),                                  # plain tcp
                     dealer(ctx, endpoint, trust.server_public, zmq.curve_keypair()),
                     dealer(ctx, endpoint, JobTrust(new_secret()).server_public,
                            (trust.client_public, trust.client_secret))]
        for sock in strangers:
            sock.send_multipart(forged(b"stranger"))
        assert transport.router.receive(1500) is None
        peer = transport.peer(endpoint)
        peer.send(m.Msg(m.addr(0, 0, m.kWorkerParam), m.STUB, m.kStop, frames=[b"insider"]))
        got = transport.router.receive(3000)
        assert got is not None and bytes(got.frames[0]) == b"insider"
        assert transport.router.receive(300) is None                 # still nothing else
        peer.close()
        for sock in strangers:
            sock.close()
    finally:
        ctx.term()


def test_a_frame_over_the_bound_is_refused_before_it_is_received(listening):
    transport, endpoint, _ = listening
    peer = transport.peer(endpoint)
    try:
        peer.send(m.Msg(m.addr(0, 0, m.kWorkerParam), m.STUB, m.kStop,
                        frames=[np.zeros(1 << 17, np.uint8)]))           # 128 KiB > 64 KiB
        assert transport.router.receive(1500) is None
        peer.send(m.Msg(m.addr(0, 0, m.kWorkerParam), m.STUB, m.kStop, frames=[b"small"]))
        got = transport.router.receive(5000)                # the peer reconnects: it may again
        assert got is not None and bytes(got.frames[0]) == b"small"
    finally:
        peer.close()


def test_a_peer_of_another_job_or_run_is_refused_by_its_job_id():
    """With the transport trusted (no CURVE), the job id in every message still keeps a stray
    peer of another job, or of an earlier run, out."""
    ours, earlier, same = Transport(job=12), Transport(job=11), Transport(job=12)
    try:
        endpoint = ours.listen("127.0.0.1")
        stray, peer = earlier.peer(endpoint), same.peer(endpoint)
        stray.send(m.Msg(m.addr(0, 0, m.kWorkerParam), m.STUB, m.kStop, frames=[b"stray"]))
        with pytest.raises(ClusterError, match=r"a message of another job \(b'11'\), not of "
                                               r"job 12"):
            while ours.router.receive(3000) is None:
                pass
        peer.send(m.Msg(m.addr(0, 0, m.kWorkerParam), m.STUB, m.kStop, frames=[b"ours"]))
        got = ours.router.receive(3000)
        assert got is not None and bytes(got.frames[0]) == b"ours"
        stray.close()
        peer.close()
    finally:
        for t in (ours, earlier, same):
            t.close()


def test_a_tcp_peer_that_sets_an_executors_identity_is_still_checked():
    """The job id check does not depend on ZeroMQ's identity: a tcp peer calling itself
    worker (0, 0), as an inproc Dealer is, must still carry the job's id."""
    ours = Transport(job=12)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        endpoint = ours.listen("127.0.0.1")
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, b"%d" % m.addr(0, 0, m.kWorkerParam))
        sock.connect("tcp://" + endpoint)
        forged = m.Msg(m.addr(0, 0, m.kWorkerParam), m.STUB, m.kStop, frames=[b"forged"])
        sock.send_multipart([forged.header(), *forged.frames])      # no job frame at all
        sock.send_multipart([b"11", forged.header(), *forged.frames])
        for _ in range(2):
            with pytest.raises(ClusterError, match=r"a message of another job .*not of job 12"):
                while ours.router.receive(3000) is None:
                    pass
        sock.send_multipart([b"12", forged.header(), b"ours"])
        got = ours.router.receive(3000)
        assert got is not None and bytes(got.frames[0]) == b"ours"
    finally:
        sock.close()
        ours.close()
        ctx.term()
