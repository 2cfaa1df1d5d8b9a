"""This process's part of a job: nets, param slices, stub entries and executors (no ZooKeeper).

Params are cut into slices over the servers of a group (SINGA's Slice / PartitionSlices,
src/utils/common.cc); which executors run in which process is `cluster`'s layout.
"""
import collections
import copy
import logging
import os
import socket
import threading

import zmq
from zmq.auth.thread import ThreadAuthenticator

from singa import checkpoint, device, errors
from singa.comm import msg as m
from singa.comm.liveness import PeerWatch
from singa.comm.membership import Membership
from singa.comm.param_table import ParamEntry
from singa.comm.socket import Peer, Router
from singa.comm.stub import Stub
from singa.errors import ClusterError
from singa.job import topology
from singa.layers.kernels import cudnn
from singa.net.neuralnet import NeuralNet
from singa.net.numerics import INIT, TEST, VALIDATION, WORKERS, seeds
from singa.proto import job_pb2
from singa.train import evaluation
from singa.train.place import Place
from singa.train.server import Server
from singa.train.worker import worker_class

log = logging.getLogger("singa")


def resume_from(job, folder, snap=None):
    """-resume (SINGA's Trainer::Resume): set `job` to continue from the newest complete
    snapshot in `folder` (ours: verified, every worker's file; `snap` when the caller found
    it already): its step, and versions kept unless the conf says otherwise. Returns that
    Snapshot, its files parsed (the workers load from it, not from checkpoint_path), or None
    when there is none (a fresh start)."""
    if snap is None:
        snap = checkpoint.latest_snapshot(folder, job.cluster.nworkers_per_group, log.warning,
                                          this_run=True)
    if snap is None:
        log.info("No complete checkpoint in %s; starting from step 0", folder)
        return None
    job.step = snap.step
    if not job.HasField("reset_param_version"):
        job.reset_param_version = False
    log.info("Resume from step %d", snap.step)
    return snap


def slice_masters(job, owners):
    """{slice id: address of its master server}: the server of each slice in the group that
    masters it (SINGA's slice2group and slice2server, PartitionSlices in src/driver.cc)."""
    cl = job.cluster
    pieces = topology.slice_sizes(topology.lcm(cl.nserver_groups, cl.nservers_per_group),
                                 [p.size for p in owners])
    sizes = [n for ps in pieces for n in ps]
    return {sid: m.addr(g, s, m.kServer) for sid, (g, s) in enumerate(zip(
        topology.partition_slices(cl.nserver_groups, sizes),
        topology.partition_slices(cl.nservers_per_group, sizes)))}


def slice_table(job, owners):
    """{owner param id: [(slice id, offset, size)]} and the server of each slice id."""
    cl = job.cluster
    S = cl.nservers_per_group
    pieces = topology.slice_sizes(topology.lcm(cl.nserver_groups, S), [p.size for p in owners])
    slice2server = topology.partition_slices(S, [n for ps in pieces for n in ps])
    table, sid = {}, 0
    for p, ps in zip(owners, pieces):
        rows, offset = [], 0
        for n in ps:
            rows.append((sid, offset, n))
            offset += n
            sid += 1
        table[p.id] = rows
    return table, slice2server


class Process:
    """The executors a process of a job runs, wired to its Stub (in-process messages): the
    process at `place` (a `place.Place`: `Place()` for a job's only process).

    Worker (g, j) runs partition j of group g's net, which holds every partition's layers (a
    partition's neighbours may run in other processes, reached through bridge layers), on the
    device `gpu` gives it (`device.of_workers`). Nets in one process share param values in
    memory on one device (dim-0 copies with partition 0, a later group with the first local
    group of its server group under share_memory); a copy whose owner runs elsewhere or on
    another device has its own values, which it Gets from the servers. The first worker group
    of each server group initialises the params (all from the same `seed`). Every net numbers
    its params from 0 over all its partitions, so a param's id names it in every process. Test
    and validation nets are partitioned the same way: every worker of group 0 runs its
    partition of them.
    `resume` is the Snapshot being resumed (from `resume_from`); `reporter` (a
    `singa.watch.metrics.Reporter`, or None) is handed to the workers.
    In an asynchronous job with `max_restarts`, this process rides out the loss of the
    processes of `topology.elastic_procs` (its stub's Membership waits the place's
    `rejoin_timeout` s for their restart).
    """

    def __init__(self, job, place=Place(), resume=None, reporter=None):
        cl = job.cluster
        G, K = cl.nworker_groups, cl.nworkers_per_group
        if place.nprocs != topology.nprocs(cl):
            raise ValueError(f"a place among {place.nprocs} processes for a job of "
                             f"{topology.nprocs(cl)}")
        pid, cluster_rt = place.pid, place.cluster_rt
        self.job, self.pid, self.place = job, pid, place
        rngs = seeds(job, WORKERS + G * K)
        # each worker's partition on its device; partitions elsewhere on the group's first
        devices = device.of_workers(job.gpu, topology.workers_of(cl, pid))
        if job.gpu:
            cudnn.allow_tf32(job.gpu_tf32)
        graphs, places = {}, {}    # group -> its net: every partition's layers; their devices
        for g in sorted({g for g, _ in topology.workers_of(cl, pid)}):
            # the first local group of g's server group; several server groups never share
            first = min(h for h, _ in topology.workers_of(cl, pid)
                        if topology.server_group(cl, h) == topology.server_group(cl, g))
            share = graphs.get(first) if g > first and cl.share_memory else None
            mine = rngs[WORKERS + g * K:WORKERS + (g + 1) * K]
            here = [devices[(g, j)] for j in range(K) if (g, j) in devices]
            places[g] = [devices.get((g, j), here[0]) for j in range(K)]
            graphs[g] = NeuralNet(job.neuralnet, job_pb2.kTrain, mine if K > 1 else mine[0],
                                  share, K, device=places[g],
                                  share_grads=worker_class(job).shares_grad_memory)
        nets = {(g, j): graphs[g].partition(j) if K > 1 else graphs[g]
                for g, j in topology.workers_of(cl, pid)}
        self.train_graph = graphs.get(0)
        self.train_net = nets.get((0, 0))
        eval_nets = {}
        if self.train_graph is not None:
            next_id = self.train_graph.next_id
            for name, phase, steps, rng in (
                    ("test", job_pb2.kTest, job.test_steps, rngs[TEST]),
                    ("validation", job_pb2.kVal, job.validate_steps, rngs[VALIDATION])):
                if steps > 0:
                    net = evaluation.eval_net(job.neuralnet, phase,
                                              rng.spawn(K) if K > 1 else rng,
                                              self.train_graph, K, first_id=next_id,
                                              device=places[0])
                    next_id = net.next_id
                    eval_nets[name] = {j: net.partition(j) if K > 1 else net
                                       for g, j in nets if g == 0}
        self.eval_nets = eval_nets

        entries = {}
        if nets:
            graph = next(iter(graphs.values()))
            table, slice2server = slice_table(job, graph.owner_params)
            shares = collections.Counter(p.owner for layer in graph.layers
                                         if layer.unroll_index == 0 for p in layer.params)
        for (g, j), net in nets.items():
            for layer in net.layers:
                if layer.unroll_index > 0:
                    continue
                for p in layer.params:
                    e = entries.get((g, p.owner))
                    if e is None:
                        sg = topology.server_group(cl, g)
                        e = entries[(g, p.owner)] = ParamEntry(g, p.owner, [
                            (s, m.addr(sg, slice2server[s], m.kServer), o, n)
                            for s, o, n in table[p.owner]])
                        e.num_total = shares[p.owner]     # every copy in the group's graph
                    e.add_share(m.addr(g, j, m.kWorkerParam), p.id)

        self.transport = place.transport or Transport()
        self.router = self.transport.router
        endpoint = self.router.endpoint
        # what a process of several adds: routes to the others' stubs, and servers that end on
        # their workers' farewells (alone, they stop with the workers of this process)
        served, farewells, locate, peer, server_workers = {}, {}, None, None, {}
        if not place.alone:
            served = {sg: K * sum(topology.server_group(cl, g) == sg for g in range(G))
                      for sg in range(cl.nserver_groups)}
            server_workers = {m.addr(sg, s, m.kServer): [
                m.addr(g, j, m.kWorkerParam) for g in range(G)
                if topology.server_group(cl, g) == sg for j in range(K)]
                for sg, s in topology.servers_of(cl, pid)}
            farewells = {m.addr(g, j, m.kWorkerParam): [
                m.addr(topology.server_group(cl, g), s, m.kServer)
                for s in range(cl.nservers_per_group)] for g, j in nets}
            locate, peer = self.locate, self.peer
        masters = None
        if cl.nserver_groups > 1 and topology.servers_of(cl, pid):
            graph = next(iter(graphs.values()), None) or NeuralNet(job.neuralnet, job_pb2.kTrain,
                                                                   rngs[WORKERS])
            masters = slice_masters(job, graph.owner_params)
        asynchronous = topology.nworker_groups_per_server_group(cl) > 1
        self.servers = [Server(endpoint, g, s, job.updater, cl.poll_time, served.get(g), masters,
                               cl.sync_freq, copy_replies=asynchronous and not place.alone)
                        for g, s in topology.servers_of(cl, pid)]
        cls = worker_class(job)
        self.workers = [
            cls(endpoint, g, j, job, net,
                eval_nets.get("test", {}).get(j) if g == 0 else None,
                eval_nets.get("validation", {}).get(j) if g == 0 else None,
                init_rng=copy.deepcopy(rngs[INIT]), resume=resume, place=place,
                reporter=reporter, device=devices[(g, j)])
            for (g, j), net in nets.items()]
        elastic = topology.elastic_procs(cl, job.max_restarts) - {pid}
        members = Membership(elastic, self.forget, self.returned, place.rejoin_timeout,
                             lambda: cluster_rt is not None and cluster_rt.connected)
        self.stub = Stub(self.router, entries, [x.address for x in self.servers + self.workers],
                         cl.poll_time, pid, locate, peer, place.alone, farewells, place.nprocs,
                         members, server_workers)
        self.cluster_rt = cluster_rt
        self.peers, self.connect = {}, place.endpoint
        self.lost_at = {}       # procs id -> the endpoint it was lost at
        self.watch = None

    def largest_frame(self):
        """Bytes of the largest array this process's executors may send another process: a
        param's values or a layer's blob (bridge layers) of any of its nets; a server-only
        process builds a train net to know its params."""
        nets = [self.train_graph] + [n for by in self.eval_nets.values() for n in by.values()]
        nets = [n for n in nets if n is not None] or \
            [NeuralNet(self.job.neuralnet, job_pb2.kTrain, seeds(self.job, 1)[0])]
        largest = 0
        for net in nets:
            for layer in getattr(net, "graph", net).layers:
                for a in [getattr(layer, "data", None), getattr(layer, "grad", None)] + \
                        [p.data for p in layer.params]:
                    if hasattr(a, "nbytes"):     # an array of the host or of a GPU
                        largest = max(largest, a.nbytes)
        return largest

    def locate(self, address):
        """The process of the executor at `address`."""
        cl = self.job.cluster
        grp, id_, kind = m.addr_grp(address), m.addr_id(address), m.addr_type(address)
        if kind == m.kServer and 0 <= grp < cl.nserver_groups and id_ < cl.nservers_per_group:
            return topology.server_procs(cl, grp, id_)
        if kind in (m.kWorkerParam, m.kWorkerLayer) and 0 <= grp < cl.nworker_groups \
                and id_ < cl.nworkers_per_group:
            return topology.worker_procs(cl, grp, id_)
        raise ClusterError(f"no executor at address {address}")

    def peer(self, pid):
        """The Peer to process `pid`, connected now if needed (watched, when the others are:
        a restarted process's new endpoint)."""
        if pid not in self.peers:
            self.peers[pid] = self.transport.peer(self.connect(pid),
                                                  watched=self.watch is not None)
            if self.watch is not None:
                self.watch.add(pid, self.peers[pid])
        return self.peers[pid]

    def forget(self, pid):
        """Drop the connection to process `pid` (lost, or restarted elsewhere), and say in the
        cluster runtime that it was taken for lost (should it run on: a freeze)."""
        peer = self.peers.pop(pid, None)
        if peer is not None:
            if peer.events is not None:     # its watch reads the events left, then drops them
                peer.unwatch()
            peer.close()
        if self.cluster_rt is not None:
            known = self.cluster_rt.known_endpoints().get(pid)
            if known is not None:
                self.lost_at[pid] = known
                self.cluster_rt.mark_lost(pid, known)
            self.cluster_rt.forget(pid)

    def returned(self, pid):
        """Whether process `pid` is registered again, at another endpoint than the one it was
        lost at (a message of the lost process may arrive late)."""
        try:
            endpoint = self.connect(pid, timeout=0.001)
        except ClusterError:
            return False
        if endpoint == self.lost_at.get(pid):
            self.cluster_rt.forget(pid)
            return False
        return True

    def watch_peers(self, on_down):
        """Connect to every other process of the job now and watch those connections until
        the stub stops: `on_down(procs id)` (in the watch's thread) once a process's connection
        has dropped for good (`singa.comm.liveness`). Before `run` or `route`, instead of
        connecting as messages need."""
        self.peers = {pid: self.transport.peer(self.connect(pid), watched=True)
                      for pid in range(topology.nprocs(self.job.cluster)) if pid != self.pid}
        self.watch = PeerWatch(self.peers, on_down)
        self.watch.start()

    def run(self):
        """`route`, then close every socket."""
        try:
            self.route()
        finally:
            self.close()

    def route(self):
        """Run every executor in its thread and route until all stop (the sockets stay open:
        a farewell may follow); raise the first failure."""
        threads = [threading.Thread(target=x.run, name=f"{type(x).__name__}-{x.grp}-{x.id}",
                                    daemon=True) for x in self.servers + self.workers]
        if self.cluster_rt is not None:     # registered by now
            self.stub.incarnation = self.cluster_rt.incarnation
        for t in threads:
            t.start()
        try:
            failure = self.stub.run()
        finally:
            if self.watch is not None:      # this process ends: no more reports
                self.watch.stop()
            for t in threads:
                t.join(timeout=30)
        if failure is not None:
            raise failure_error(*failure)

    def close(self):
        for w in self.workers:
            for net in (w.train_net, w.test_net, w.val_net):
                if net is not None:
                    net.close()
        if self.watch is not None:
            self.watch.close()
        for peer in self.peers.values():
            peer.close()
        for x in self.servers + self.workers:
            x.dealer.close()
        for w in self.workers:
            if w.channel is not None:
                w.channel.close()
        self.transport.close()


class Transport:
    """A process's ZeroMQ context and its stub's Router (in-process queues, plus tcp for peers).

    With a `trust` (`singa.comm.trust.JobTrust`) tcp is CURVE: the Router is the server of the
    job's keys, a ZAP handler admits the job's client key only, and Peers are its clients."""

    def __init__(self, trust=None, job=-1):
        """`job`: the job's id, in every message to another process and checked in theirs."""
        self.ctx = zmq.Context()
        self.trust, self.job = trust, job
        self.auth = None
        self.router = Router(self.ctx, f"inproc://singa-stub-{os.getpid()}-{id(self)}", job)

    def listen(self, host, max_frame=-1):
        """Accept other processes' messages on `tcp://<host's address>:<free port>`, frames
        of at most `max_frame` bytes (-1: any); returns "address:port", the endpoint to
        register in ZooKeeper. Never every interface."""
        try:
            address = socket.gethostbyname(host)
        except OSError as e:
            raise ClusterError(f"host {host}: cannot resolve its address: {e}") from None
        if self.trust is not None and self.auth is None:
            self.auth = ThreadAuthenticator(self.ctx, log=log.getChild("zap"))
            self.auth.start()
            self.auth.configure_curve_callback("*", credentials_provider=_Admit(
                self.trust.client_public))
        return self.router.bind(f"tcp://{address}:*", self.trust, max_frame) \
            .removeprefix("tcp://")

    def peer(self, endpoint, watched=False):
        """A Peer connected to another process's stub at tcp `endpoint` ("address:port")."""
        return Peer(self.ctx, "tcp://" + endpoint, self.trust, self.job, watched)

    def close(self):
        self.router.close()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()


class _Admit:
    """The ZAP handler's rule: a CURVE client is admitted when its key is the job's."""

    def __init__(self, key):
        self.key = key

    def callback(self, domain, key):
        return key == self.key


def failure_error(kind, text):
    """The SingaError an executor's kError names (its own type when a singa.errors type)."""
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, errors.SingaError):
        return cls(text)
    return errors.ExecutorError(text)
