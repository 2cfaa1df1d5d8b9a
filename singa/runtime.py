"""This process's part of a job: nets, param slices, stub entries and executors (no ZooKeeper).

Worker (g, j) runs partition j of group g's net (data parallel: replicas j > 0 share partition
0's param values in memory); groups > 0 share group 0's values (share_memory). Params are cut
into slices over the servers of a group (SINGA's Slice / PartitionSlices, src/utils/common.cc).
"""
import logging
import os
import threading

import numpy as np
import zmq

from singa import checkpoint, cluster, errors
from singa.comm import msg as m
from singa.comm.socket import Router
from singa.comm.stub import ParamEntry, Stub
from singa.neuralnet import NeuralNet
from singa.proto import job_pb2
from singa.server import Server
from singa.worker import worker_class

log = logging.getLogger("singa")


def seeds(job, n):
    """`n` independent RNG streams from the job's `seed` (the clock when unset, as SINGA)."""
    seq = np.random.SeedSequence(job.seed if job.HasField("seed") else None)
    return [np.random.Generator(np.random.PCG64(s)) for s in seq.spawn(n)]


def resume_from(job, folder):
    """-resume (SINGA's Trainer::Resume): set `job` to continue from the newest complete
    snapshot in `folder` (ours: verified, every worker's file); {worker id: its file}, or {}
    when there is none (a fresh start)."""
    snap = checkpoint.latest_snapshot(folder, job.cluster.nworkers_per_group, log.warning)
    if snap is None:
        log.info("No complete checkpoint in %s; starting from step 0", folder)
        return {}
    job.step = snap.step
    if not job.HasField("reset_param_version"):
        job.reset_param_version = False
    del job.checkpoint_path[:]
    job.checkpoint_path.extend(snap.files[w] for w in sorted(snap.files))
    log.info("Resume from step %d", snap.step)
    return dict(snap.files)


def slice_table(job, owners):
    """{owner param id: [(slice id, offset, size)]} and the server of each slice id."""
    cl = job.cluster
    S = cl.nservers_per_group
    pieces = cluster.slice_sizes(cluster.lcm(cl.nserver_groups, S), [p.size for p in owners])
    slice2server = cluster.partition_slices(S, [n for ps in pieces for n in ps])
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
    """Every executor of a single-process job, wired to one Stub over `inproc://` sockets.

    `resume` maps worker id -> its file of the snapshot being resumed; `membership` is handed
    to the workers (ZooKeeper's server-group membership, or None).
    """

    def __init__(self, job, resume=None, membership=None):
        cl = job.cluster
        G, K, S = cl.nworker_groups, cl.nworkers_per_group, cl.nservers_per_group
        rngs = seeds(job, 3 + G * K)   # init, test, validation, one per worker
        nets, next_id = {}, 0
        for g in range(G):
            for j in range(K):
                share = nets[(g, 0)] if j > 0 else (nets[(0, 0)] if g > 0 else None)
                net = NeuralNet(job.neuralnet, job_pb2.kTrain, rngs[3 + g * K + j], share, j, K,
                                next_id)
                nets[(g, j)] = net
                next_id = net.next_id
        self.train_net = train = nets[(0, 0)]
        eval_nets = {}
        for name, phase, steps, rng in (("test", job_pb2.kTest, job.test_steps, rngs[1]),
                                        ("validation", job_pb2.kVal, job.validate_steps, rngs[2])):
            if steps > 0:
                eval_nets[name] = NeuralNet(job.neuralnet, phase, rng, train, first_id=next_id)
                next_id = eval_nets[name].next_id
        self.eval_nets = eval_nets

        table, slice2server = slice_table(job, train.owner_params)
        entries = {}
        for (g, j), net in nets.items():
            for layer in net.layers:
                if layer.unroll_index > 0:
                    continue
                for p in layer.params:
                    e = entries.get((g, p.owner))
                    if e is None:
                        e = entries[(g, p.owner)] = ParamEntry(g, p.owner, [
                            (s, m.addr(0, slice2server[s], m.kServer), o, n)
                            for s, o, n in table[p.owner]])
                    e.add_share(m.addr(g, j, m.kWorkerParam), p.id)
        for e in entries.values():
            e.num_total = e.num_local

        self.ctx = zmq.Context()
        self.router = Router(self.ctx, f"inproc://singa-stub-{os.getpid()}-{id(self)}")
        endpoint = self.router.endpoint
        self.servers = [Server(self.ctx, endpoint, 0, s, job.updater, cl.poll_time)
                        for s in range(S)]
        resume = resume or {}
        cls = worker_class(job)
        self.workers = [
            cls(self.ctx, endpoint, g, j, job, net,
                eval_nets.get("test") if (g, j) == (0, 0) else None,
                eval_nets.get("validation") if (g, j) == (0, 0) else None,
                init_rng=rngs[0], resume=resume.get(j) if g == 0 else None,
                membership=membership)
            for (g, j), net in nets.items()]
        self.stub = Stub(self.router, entries, [x.address for x in self.servers + self.workers],
                         cl.poll_time)

    def run(self):
        """Run every executor in its thread and route until all stop; raise the first failure."""
        threads = [threading.Thread(target=x.run, name=f"{type(x).__name__}-{x.grp}-{x.id}",
                                    daemon=True) for x in self.servers + self.workers]
        for t in threads:
            t.start()
        try:
            failure = self.stub.run()
        finally:
            for t in threads:
                t.join(timeout=30)
            self.close()
        if failure is not None:
            raise failure_error(*failure)

    def close(self):
        self.router.close()
        for x in self.servers + self.workers:
            x.dealer.close()
        self.ctx.term()


def failure_error(kind, text):
    """The SingaError an executor's kError names (its own type when a singa.errors type)."""
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, errors.SingaError):
        return cls(text)
    return errors.ExecutorError(text)
