"""The `singa` process (SINGA's main.cc + Driver, §6.6): flags, setup, train or test.

    singa -conf JOB_CONF [-singa_conf SINGA_CONF] [-singa_job ID] [-host HOST] [-resume|-test]

Registers with ZooKeeper, builds the nets, starts one Server and one Worker thread that talk
to this process's Stub (run by the main thread) over ZeroMQ, and reports user mistakes as one
line on stderr with exit code 2.
"""
import logging
import os
import sys
import threading

import numpy as np
import zmq

import singa
from singa import checkpoint, config
from singa import log as singa_log
from singa.comm import msg as m
from singa.comm.socket import Router
from singa.comm.stub import ParamEntry, Stub
from singa.errors import ConfigError, SingaError
from singa.neuralnet import NeuralNet
from singa.proto import job_pb2
from singa.server import Server
from singa.updater import create_updater
from singa.worker import Worker

log = logging.getLogger("singa")

USAGE = "usage: singa -conf JOB_CONF [-singa_conf SINGA_CONF] [-singa_job ID] [-host HOST] [-resume|-test]"


def parse_flags(argv):
    """SINGA's flags: found anywhere in argv by exact match, value = the next argument."""
    flags = {"resume": "-resume" in argv, "test": "-test" in argv}
    for name in ("-conf", "-singa_conf", "-singa_job", "-host"):
        if name in argv:
            i = argv.index(name)
            if i + 1 >= len(argv):
                raise ConfigError(f"flag {name} needs a value; {USAGE}")
            flags[name[1:]] = argv[i + 1]
    if "conf" not in flags:
        raise ConfigError(f"no job conf given; {USAGE}")
    return flags


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        flags = parse_flags(argv)
        job = config.load_job(flags["conf"])
        singa_conf = config.load_singa_conf(
            flags.get("singa_conf") or os.path.join(singa.HOME, "conf", "singa.conf"))
        Driver(job, singa_conf, flags).run()
    except SingaError as e:
        print(f"singa: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("singa: interrupted", file=sys.stderr)
        return 130
    return 0


class Driver:
    """One process of a job: here, every executor of a single-process job."""

    def __init__(self, job, singa_conf, flags):
        self.job = job
        self.singa_conf = singa_conf
        self.flags = flags
        self.job_id = int(flags.get("singa_job", -1))
        self.host = flags.get("host", "localhost")
        self.workspace = config.resolve(job.cluster.workspace)
        self.folder = os.path.join(self.workspace, "checkpoint")
        self.restored = None        # the snapshot a -resume continues from
        self.own_steps = set()      # snapshots this job wrote (the only ones retention deletes)
        self.last_test = None       # (step, metrics) of the latest test

    # --- setup ----------------------------------------------------------------------------
    def run(self):
        from singa.zk import ZK
        job, cl = self.job, self.job.cluster
        check_cluster(job)
        zk = ZK(self.singa_conf.zookeeper_host)
        try:
            if self.job_id < 0:
                self.job_id = zk.new_job_id()
            job.id = self.job_id
            path = singa_log.setup(self.singa_conf.log_dir, f"{self.job_id}-{job.name}")
            if path:
                log.info("Record job log to %s", path)
            procs_id = zk.register_proc(self.job_id, f"{self.host}:0", os.getpid())
            log.info("proc #%d -> %s:0 (pid = %d)", procs_id, self.host, os.getpid())
            for sub in ("checkpoint", "visualization"):
                os.makedirs(os.path.join(self.workspace, sub), exist_ok=True)
            if self.flags["test"]:
                self.test()
            else:
                self.train(zk)
        finally:
            zk.close()

    def seeds(self):
        """Independent RNG streams (init, train, test, validation) from the job's `seed`."""
        seq = np.random.SeedSequence(self.job.seed if self.job.HasField("seed") else None)
        return [np.random.Generator(np.random.PCG64(s)) for s in seq.spawn(4)]

    def build_nets(self, rngs, phases):
        net = self.job.neuralnet
        nets = {job_pb2.kTrain: NeuralNet(net, job_pb2.kTrain, rngs[1])} \
            if job_pb2.kTrain in phases else {}
        train = nets.get(job_pb2.kTrain)
        if job_pb2.kTest in phases and self.job.test_steps > 0:
            nets[job_pb2.kTest] = NeuralNet(net, job_pb2.kTest, rngs[2], share_from=train)
        if job_pb2.kVal in phases and self.job.validate_steps > 0:
            nets[job_pb2.kVal] = NeuralNet(net, job_pb2.kVal, rngs[3], share_from=train)
        return nets

    def setup_for_resume(self):
        """§2.7: continue from the newest complete snapshot (ours: verified, all workers)."""
        job = self.job
        snap = checkpoint.latest_snapshot(self.folder, log=log.warning)
        if snap is None:
            log.info("No complete checkpoint in %s; starting from step 0", self.folder)
            return
        job.step = snap.step
        if not job.HasField("reset_param_version"):
            job.reset_param_version = False
        del job.checkpoint_path[:]
        job.checkpoint_path.extend(snap.files[w] for w in sorted(snap.files))
        self.restored = snap
        log.info("Resume from step %d", snap.step)

    # --- training -------------------------------------------------------------------------
    def train(self, zk):
        if self.flags["resume"]:
            self.setup_for_resume()
        self.zk = zk
        self.setup_executors()
        server, worker = self.server, self.worker
        zk.watch_sgroup(self.job_id, 0, server.stop)
        threads = [threading.Thread(target=x.run, name=name, daemon=True)
                   for x, name in ((server, "server-0-0"), (worker, "worker-0-0"))]
        for t in threads:
            t.start()
        try:
            self.stub.run()
        finally:
            worker.abort.set()
            server.stop()
            for t in threads:
                t.join(timeout=30)
            self.close_executors()
        for x in (server, worker):
            if x.error is not None:
                if isinstance(x.error, SingaError):
                    raise x.error
                raise RuntimeError(f"{type(x).__name__} failed") from x.error

    def setup_executors(self):
        """Nets, updater, the Stub's Router, one Server and one Worker, all in this process."""
        job = self.job
        self.rngs = self.seeds()
        self.nets = self.build_nets(self.rngs, (job_pb2.kTrain, job_pb2.kTest, job_pb2.kVal))
        self.train_net = train = self.nets[job_pb2.kTrain]
        self.updater = create_updater(job.updater)
        self.ctx = zmq.Context()
        self.router = Router(self.ctx, f"inproc://singa-stub-{os.getpid()}-{id(self)}")
        server_addr = m.addr(0, 0, m.kServer)
        entries = {}
        for layer in train.layers:
            if layer.unroll_index > 0:
                continue
            for p in layer.params:
                e = entries.get((0, p.owner))
                if e is None:
                    owner = train.params[p.owner]
                    e = entries[(0, p.owner)] = ParamEntry(
                        0, p.owner, 0, [(p.owner, server_addr, 0, owner.size)])
                e.add_share(m.addr(0, 0, m.kWorkerParam), p)
        for e in entries.values():
            e.num_total = e.num_local
        restore = self.restore_state() if self.restored is not None else None
        poll = job.cluster.poll_time
        self.server = Server(self.ctx, self.router.endpoint, 0, 0, self.updater, poll, restore)
        self.worker = Worker(self.ctx, self.router.endpoint, 0, 0, job, train,
                             self.nets.get(job_pb2.kTest), self.nets.get(job_pb2.kVal), hooks=self)
        executors = (self.server, self.worker)
        self.stub = Stub(self.router, m.addr(-1, -1, m.kStub), entries, 1, 1, poll,
                         alive=lambda: not any(x.error for x in executors))

    def close_executors(self):
        self.router.close()
        self.server.dealer.close()
        self.worker.dealer.close()
        self.ctx.term()

    # --- hooks called by the worker thread ------------------------------------------------
    def joined(self, worker):
        self.zk.join_sgroup(self.job_id, worker.grp, worker.id, 0)

    def left(self, worker):
        self.zk.leave_sgroup(self.job_id, worker.grp, worker.id, 0)

    def tested(self, worker, step, metrics):
        self.last_test = (step, metrics)

    def init_params(self, worker):
        """§2.6: load `checkpoint_path` by name, init the rest, Put owners, Get the others."""
        job, net = self.job, worker.train_net
        owners = {p.name: p for p in net.owner_params}
        paths = checkpoint.resolve_checkpoint_paths(list(job.checkpoint_path), self.workspace)
        loaded = checkpoint.load_params(paths, owners, log=log.info) if paths else {}
        for p in net.owner_params:
            if p.name in loaded:
                if job.reset_param_version:
                    p.version = job.step
            else:
                p.init_values(self.rngs[0], job.step)
                if paths:
                    log.info("Param %s: freshly initialised (%s)", p.name,
                             job_pb2.InitMethod.Name(p.proto.init.type))
        if self.restored is not None:
            self.restore_streams()
        for p in net.owner_params:
            worker.put(p)
        for p in net.params:
            worker.get(job.warmup_steps, p)

    def checkpoint(self, worker, step):
        """Write `step<step>-worker<id>.bin` with params and everything a bit-exact resume needs."""
        net = worker.train_net
        state = checkpoint.SnapshotState(
            step=step,
            param_state={p.name: self.server.slices[p.owner].state for p in net.owner_params
                         if p.owner in self.server.slices},
            rng={name: n.rng.bit_generator.state for name, n in self.named_nets()},
            reader={f"{name}/{layer.name}": (layer.get_state()["offset"], layer.get_state()["skipped"])
                    for name, n in self.named_nets() for layer in n.input_layers()},
            lr_index=self.updater.lr_gen.get_state() if hasattr(self.updater, "lr_gen") else 0,
            nworkers=self.job.cluster.nworkers_per_group,
            metrics=self.last_test[1] if self.last_test and self.last_test[0] == step else {})
        path = os.path.join(self.folder, f"step{step}-worker{worker.id}.bin")
        checkpoint.write_file(path, [(p.name, p.data, p.version) for p in net.owner_params], state)
        log.info("checkpoint to %s", path)
        self.own_steps.add(step)
        if self.job.checkpoint_keep_newest or self.job.checkpoint_keep_best:
            checkpoint.prune(self.folder, self.job.checkpoint_keep_newest,
                             self.job.checkpoint_keep_best, self.own_steps)

    def named_nets(self):
        names = {job_pb2.kTrain: "train", job_pb2.kTest: "test", job_pb2.kVal: "validation"}
        return [(names[phase], net) for phase, net in self.nets.items()]

    # --- bit-exact resume -----------------------------------------------------------------
    def restore_state(self):
        """Updater buffers by slice id, from the snapshot being resumed (empty for SINGA files)."""
        st = self.restored_state()
        out = {}
        if st is None:
            return out
        for p in self.train_net.owner_params:
            bufs = st.param_state.get(p.name)
            if bufs:
                out[p.owner] = [np.ascontiguousarray(b, np.float32).reshape(-1) for b in bufs]
        if hasattr(self.updater, "lr_gen"):
            self.updater.lr_gen.set_state(st.lr_index)
        return out

    def restored_state(self):
        if not hasattr(self, "_restored_state"):
            files = self.restored.files
            self._restored_state = checkpoint.CheckpointReader(files[min(files)]).state
        return self._restored_state

    def restore_streams(self):
        st = self.restored_state()
        if st is None:
            return
        for name, net in self.named_nets():
            if name in st.rng:
                net.rng.bit_generator.state = st.rng[name]
            for layer in net.input_layers():
                saved = st.reader.get(f"{name}/{layer.name}")
                if saved is not None:
                    layer.set_state(*saved)

    # --- -test ----------------------------------------------------------------------------
    def test(self):
        """§2.9: load every param of the test net from `checkpoint_path`, run `test_steps`."""
        job = self.job
        if job.test_steps <= 0:
            raise ConfigError(f"{job.name}: -test needs test_steps > 0")
        rngs = self.seeds()
        net = NeuralNet(job.neuralnet, job_pb2.kTest, rngs[2])
        owners = {p.name: p for p in net.owner_params}
        paths = checkpoint.resolve_checkpoint_paths(list(job.checkpoint_path), self.workspace)
        if not paths:
            raise ConfigError("-test needs checkpoint_path in the job conf (a file, 'latest' or 'best')")
        loaded = checkpoint.load_params(paths, owners, log=log.info)
        missing = [n for n in owners if n not in loaded]
        if missing:
            raise ConfigError(f"-test: params {', '.join(missing)} are in none of the "
                              f"checkpoint_path files")
        log.info("Test @ step %d", job.step)
        for _ in range(job.test_steps):
            net.forward(job_pb2.kTest | job_pb2.kForward)
        for line in net.display(job_pb2.kTest):
            log.info("   %s", line)


def check_cluster(job):
    cl = job.cluster
    if (cl.nworker_groups, cl.nworkers_per_group, cl.nserver_groups, cl.nservers_per_group) != (1, 1, 1, 1):
        raise ConfigError(f"cluster: only 1 worker group of 1 worker and 1 server group of 1 "
                          f"server are supported in this version (got nworker_groups "
                          f"{cl.nworker_groups}, nworkers_per_group {cl.nworkers_per_group}, "
                          f"nserver_groups {cl.nserver_groups}, nservers_per_group "
                          f"{cl.nservers_per_group})")


if __name__ == "__main__":
    sys.exit(main())
