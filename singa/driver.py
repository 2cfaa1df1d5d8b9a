"""The `singa` process (SINGA's src/main.cc + src/driver.cc): flags, setup, train or test.

    singa -conf JOB_CONF [-singa_conf SINGA_CONF] [-singa_job ID] [-host HOST] [-resume|-test]
          [-user_proto FILE.proto]... [-user_layers FILE.py]...

Registers with ZooKeeper, builds the nets, starts a thread per Server and per Worker that
talk to this process's Stub (run by the main thread) over ZeroMQ, and reports user mistakes
as one line on stderr with exit code 2.
"""
import logging
import os
import sys
import threading
import time

import numpy as np
import zmq
from threadpoolctl import threadpool_limits

import singa
from singa import checkpoint, cluster, config
from singa import log as singa_log
from singa.comm import msg as m
from singa.comm.socket import Router
from singa.comm.stub import ParamEntry, Stub
from singa.errors import CheckpointError, ClusterError, ConfigError, SingaError
from singa.neuralnet import NeuralNet
from singa.proto import job_pb2
from singa.server import Server
from singa.updater import create_updater
from singa.worker import AbortedError, worker_class
from singa.zk import ZK

log = logging.getLogger("singa")

USAGE = ("usage: singa -conf JOB_CONF [-singa_conf SINGA_CONF] [-singa_job ID] [-host HOST] "
         "[-resume|-test] [-user_proto FILE.proto]... [-user_layers FILE.py]...")


def parse_flags(argv):
    """SINGA's flags: found anywhere in argv by exact match, value = the next argument."""
    flags = {"resume": "-resume" in argv, "test": "-test" in argv}
    for name in ("-conf", "-singa_conf", "-singa_job", "-host"):
        if name in argv:
            i = argv.index(name)
            if i + 1 >= len(argv):
                raise ConfigError(f"flag {name} needs a value; {USAGE}")
            flags[name[1:]] = argv[i + 1]
    for name in ("-user_proto", "-user_layers"):   # repeatable; paths relative to the cwd
        at = [i for i, a in enumerate(argv) if a == name]
        if at and at[-1] + 1 >= len(argv):
            raise ConfigError(f"flag {name} needs a value; {USAGE}")
        flags[name[1:]] = [os.path.abspath(argv[i + 1]) for i in at]
    if "conf" not in flags:
        raise ConfigError(f"no job conf given; {USAGE}")
    return flags


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        flags = parse_flags(argv)
        job = config.load_job(os.path.abspath(flags["conf"]), user_proto=flags["user_proto"],
                              user_layers=flags["user_layers"])
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
        job = self.job
        if not self.flags["test"]:
            check_runnable(job)
        zk = ZK(self.singa_conf.zookeeper_host)
        # SINGA passes num_openblas_threads (default 1) to openblas_set_num_threads
        blas = threadpool_limits(max(1, job.num_openblas_threads), user_api="blas")
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
            blas.restore_original_limits()
            zk.close()

    def seeds(self, n):
        """`n` independent RNG streams from the job's `seed` (the clock when unset, as SINGA)."""
        seq = np.random.SeedSequence(self.job.seed if self.job.HasField("seed") else None)
        return [np.random.Generator(np.random.PCG64(s)) for s in seq.spawn(n)]

    def setup_for_resume(self):
        """-resume (SINGA's Trainer::Resume): continue from the newest complete snapshot (ours: verified, all workers)."""
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
        stale = checkpoint.remove_stale_temporaries(self.folder)
        if stale:
            log.info("Removed %d temporary files of interrupted checkpoint writes", len(stale))
        if self.flags["resume"]:
            self.setup_for_resume()
        self.zk = zk
        self.setup_executors()
        servers, workers = self.servers, self.workers

        def stop_servers():
            for s in servers:
                s.stop()
        zk.watch_sgroup(self.job_id, 0, stop_servers)
        threads = [threading.Thread(target=x.run, name=f"{type(x).__name__}-{x.grp}-{x.id}",
                                    daemon=True) for x in servers + workers]
        for t in threads:
            t.start()
        try:
            self.stub.run()
        finally:
            for w in workers:
                w.abort.set()
            stop_servers()
            for t in threads:
                t.join(timeout=30)
            self.close_executors()
        for x in servers + workers:
            if x.error is not None:
                if isinstance(x.error, SingaError):
                    raise x.error
                raise RuntimeError(f"{type(x).__name__} failed") from x.error

    def setup_executors(self):
        """Nets, updater, the Stub's Router, every Server and Worker of this (single) process.

        Worker (g, j) runs partition j of group g's net (data parallel: replicas j > 0 share
        partition 0's param values); groups > 0 share group 0's values (share_memory).
        Params are cut into slices over the servers of a group (SINGA's Slice).
        """
        job, cl = self.job, self.job.cluster
        G, K, S = cl.nworker_groups, cl.nworkers_per_group, cl.nservers_per_group
        self.rngs = rngs = self.seeds(3 + G * K)   # init, test, validation, one per worker
        nets, next_id = {}, 0
        for g in range(G):
            for j in range(K):
                share = nets[(g, 0)] if j > 0 else (nets[(0, 0)] if g > 0 else None)
                net = NeuralNet(job.neuralnet, job_pb2.kTrain, rngs[3 + g * K + j], share, j, K,
                                next_id)
                nets[(g, j)] = net
                next_id = net.next_id
        self.train_nets = nets
        self.train_net = train = nets[(0, 0)]
        self.eval_nets = {}
        if job.test_steps > 0:
            self.eval_nets["test"] = NeuralNet(job.neuralnet, job_pb2.kTest, rngs[1], train,
                                               first_id=next_id)
            next_id = self.eval_nets["test"].next_id
        if job.validate_steps > 0:
            self.eval_nets["validation"] = NeuralNet(job.neuralnet, job_pb2.kVal, rngs[2], train,
                                                     first_id=next_id)
        with open(os.path.join(self.workspace, "visualization", "train_net.json"), "w") as f:
            f.write(train.to_json())
        self.updater = create_updater(job.updater)
        self.ctx = zmq.Context()
        self.router = Router(self.ctx, f"inproc://singa-stub-{os.getpid()}-{id(self)}")

        owners = train.owner_params
        pieces = cluster.slice_sizes(cluster.lcm(cl.nserver_groups, S), [p.size for p in owners])
        slice2server = cluster.partition_slices(S, [n for ps in pieces for n in ps])
        self.slice_table, sid = {}, 0
        for p, ps in zip(owners, pieces):
            table, offset = [], 0
            for n in ps:
                table.append((sid, offset, n))
                offset += n
                sid += 1
            self.slice_table[p.id] = table
        entries = {}
        for (g, j), net in nets.items():
            for layer in net.layers:
                if layer.unroll_index > 0:
                    continue
                for p in layer.params:
                    e = entries.get((g, p.owner))
                    if e is None:
                        e = entries[(g, p.owner)] = ParamEntry(g, p.owner, 0, [
                            (s, m.addr(0, slice2server[s], m.kServer), o, n)
                            for s, o, n in self.slice_table[p.owner]])
                    e.add_share(m.addr(g, j, m.kWorkerParam), p)
        for e in entries.values():
            e.num_total = e.num_local
        restore = self.restore_state() if self.restored is not None else None
        poll = cl.poll_time
        self.servers = [Server(self.ctx, self.router.endpoint, 0, s, self.updater, poll, restore)
                        for s in range(S)]
        self.server_of_slice = [self.servers[x] for x in slice2server]
        self.workers = [worker_class(job)(self.ctx, self.router.endpoint, g, j, job, net,
                               self.eval_nets.get("test") if (g, j) == (0, 0) else None,
                               self.eval_nets.get("validation") if (g, j) == (0, 0) else None,
                               hooks=self)
                        for (g, j), net in nets.items()]
        if self.restored is not None:
            st = self.restored_state(0)
            for w in self.workers:
                w.resumed_evaluated = st is not None and st.evaluated
        executors = self.servers + self.workers
        self.stub = Stub(self.router, m.addr(-1, -1, m.kStub), entries, len(self.workers),
                         len(self.servers), poll, alive=lambda: not any(x.error for x in executors))

    def close_executors(self):
        self.router.close()
        for x in self.servers + self.workers:
            x.dealer.close()
        self.ctx.term()

    # --- hooks called by the worker thread ------------------------------------------------
    def joined(self, worker):
        self.zk.join_sgroup(self.job_id, worker.grp, worker.id, 0)

    def left(self, worker):
        self.zk.leave_sgroup(self.job_id, worker.grp, worker.id, 0)

    def tested(self, worker, step, metrics):
        self.last_test = (step, metrics)

    def init_params(self, worker):
        """Pretraining (Worker::InitNetParams): load `checkpoint_path` by name, init the rest, Put owners, Get the others."""
        job, net = self.job, worker.train_net
        if self.restored is not None:
            self.restore_streams(worker)
        if worker.grp > 0:      # groups > 0 share group 0's values: they only Get
            for p in net.params:
                worker.get(job.warmup_steps, p)
            return
        owners = {p.name: p for p in net.owner_params}
        paths = checkpoint.resolve_checkpoint_paths(list(job.checkpoint_path), self.workspace)
        loaded = checkpoint.load_params(paths, owners, log=log.info) if paths and owners else {}
        for p in net.owner_params:
            if p.name in loaded:
                if job.reset_param_version:
                    p.version = job.step
            else:
                p.init_values(self.rngs[0], job.step)
                if paths:
                    log.info("Param %s: freshly initialised (%s)", p.name,
                             job_pb2.InitMethod.Name(p.proto.init.type))
        for p in net.owner_params:
            worker.put(p)
        # A Put has no answer; a checkpoint right away (step 0, or a resume on the schedule)
        # reads the servers' updater state, so wait until every slice has arrived.
        sids = [sid for p in net.owner_params for sid, _, _ in self.slice_table[p.id]]
        deadline = time.monotonic() + worker.response_timeout
        while not all(sid in self.server_of_slice[sid].slices for sid in sids):
            if worker.abort.is_set():
                raise AbortedError()
            if time.monotonic() > deadline:
                raise ClusterError(f"worker ({worker.grp}, {worker.id}): servers did not take "
                                   f"the initial params in {worker.response_timeout:.0f} s")
            time.sleep(0.001)
        for p in net.params:
            worker.get(job.warmup_steps, p)

    def checkpoint(self, worker, step, final=False):
        """Write `step<step>-worker<id>.bin` with params and everything a bit-exact resume needs.

        In the loop a snapshot follows its step's test and validation (`evaluated`); the final
        one, at train_steps, does not."""
        net = worker.train_net
        state = checkpoint.SnapshotState(
            step=step,
            param_state={p.name: self.updater_state(p) for p in net.owner_params},
            rng={name: n.rng.bit_generator.state for name, n in self.named_nets(worker)},
            reader={f"{name}/{layer.name}": (layer.get_state()["offset"], layer.get_state()["skipped"])
                    for name, n in self.named_nets(worker) for layer in n.input_layers()},
            lr_index=self.updater.lr_gen.get_state() if hasattr(self.updater, "lr_gen") else 0,
            nworkers=self.job.cluster.nworkers_per_group,
            metrics=self.last_test[1] if self.last_test and self.last_test[0] == step else {},
            evaluated=not final)
        path = os.path.join(self.folder, f"step{step}-worker{worker.id}.bin")
        try:
            checkpoint.write_file(path, [(p.name, p.data, p.version) for p in net.owner_params],
                                  state)
        except OSError as e:   # e.g. a full disk: the temporary file is gone, older snapshots stay
            raise CheckpointError(f"cannot write checkpoint {path}: {e.strerror or e}") from None
        log.info("checkpoint to %s", path)
        self.own_steps.add(step)
        if self.job.checkpoint_keep_newest or self.job.checkpoint_keep_best:
            checkpoint.prune(self.folder, self.job.checkpoint_keep_newest,
                             self.job.checkpoint_keep_best, self.own_steps)

    def named_nets(self, worker):
        """The nets whose streams (RNG, readers) `worker` saves: its own, plus test/validation."""
        nets = [("train", worker.train_net)]
        if (worker.grp, worker.id) == (0, 0):
            nets += sorted(self.eval_nets.items())
        return nets

    def updater_state(self, p):
        """The updater buffers of owner param `p`, gathered from its slices, shaped like `p`."""
        parts = [self.server_of_slice[sid].slices[sid].state for sid, _, _ in self.slice_table[p.id]]
        return [np.concatenate([part[k] for part in parts]).reshape(p.shape)
                for k in range(len(parts[0]))]

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
                flat = [np.ascontiguousarray(b, np.float32).reshape(-1) for b in bufs]
                for sid, o, n in self.slice_table[p.id]:
                    out[sid] = [b[o:o + n].copy() for b in flat]
        if hasattr(self.updater, "lr_gen"):
            self.updater.lr_gen.set_state(st.lr_index)
        return out

    def restored_state(self, worker_id=0):
        """The extra state in the resumed snapshot's file of `worker_id` (None: a SINGA file)."""
        cache = self.__dict__.setdefault("_restored_states", {})
        if worker_id not in cache:
            path = self.restored.files.get(worker_id)
            cache[worker_id] = None if path is None else checkpoint.CheckpointReader(path).state
        return cache[worker_id]

    def restore_streams(self, worker):
        if worker.grp > 0:
            return
        st = self.restored_state(worker.id)
        if st is None:
            return
        for name, net in self.named_nets(worker):
            if name in st.rng:
                net.rng.bit_generator.state = st.rng[name]
            for layer in net.input_layers():
                saved = st.reader.get(f"{name}/{layer.name}")
                if saved is not None:
                    layer.set_state(*saved)

    # --- -test ----------------------------------------------------------------------------
    def test(self):
        """-test (Driver::Test): load every param of the test net from `checkpoint_path`, run `test_steps`."""
        job = self.job
        if job.test_steps <= 0:
            raise ConfigError(f"{job.name}: -test needs test_steps > 0")
        net = NeuralNet(job.neuralnet, job_pb2.kTest, self.seeds(3)[1])
        with open(os.path.join(self.workspace, "visualization", "test_net.json"), "w") as f:
            f.write(net.to_json())
        owners = {p.name: p for p in net.owner_params}
        paths = checkpoint.resolve_checkpoint_paths(list(job.checkpoint_path), self.workspace)
        if not paths:
            raise ConfigError("-test needs checkpoint_path in the job conf (a file, 'latest' or 'best')")
        loaded = checkpoint.load_params(paths, owners, log=log.info)
        missing = [n for n in owners if n not in loaded]
        if missing:
            raise ConfigError(f"-test: params {', '.join(missing)} are in none of the "
                              f"checkpoint_path files")
        step = checkpoint.CheckpointReader(paths[-1]).step
        log.info("Test @ step %d", job.step if step is None else step)
        for step in range(job.test_steps):
            worker_class(job).test_one_batch(job_pb2.kTest, net, step)
        for line in net.display(job_pb2.kTest):
            log.info("   %s", line)


def check_runnable(job):
    """What this version runs: kBP, kBPTT or kCD, every executor in one process, one server group."""
    alg = job.train_one_batch
    if alg.user_alg or alg.alg not in (job_pb2.kBP, job_pb2.kBPTT, job_pb2.kCD):
        name = alg.user_alg or job_pb2.AlgType.Name(alg.alg)
        raise ConfigError(f"train_one_batch: alg {name} is not implemented yet (kBP, kBPTT and "
                          f"kCD are)")
    if alg.alg == job_pb2.kCD and not any(layer.type == job_pb2.kRBMVis
                                          for layer in job.neuralnet.layer):
        raise ConfigError("train_one_batch: alg kCD trains RBM layers (kRBMVis, kRBMHid) and "
                          "the net has none")
    cl = job.cluster
    n = cluster.nprocs(cl)
    if n != 1:
        raise ConfigError(f"cluster: this job needs {n} processes (nworkers_per_procs "
                          f"{cl.nworkers_per_procs}, nservers_per_procs {cl.nservers_per_procs}); "
                          f"multi-process jobs are not supported yet: put every worker and "
                          f"server in one process")
    if cl.nserver_groups != 1:
        raise ConfigError(f"cluster: nserver_groups {cl.nserver_groups}: exactly one server "
                          f"group is supported yet")
    if min(cl.nworker_groups, cl.nworkers_per_group, cl.nservers_per_group) < 1:
        raise ConfigError("cluster: nworker_groups, nworkers_per_group and nservers_per_group "
                          "must be at least 1")
    if cl.nworker_groups > 1 and not cl.share_memory:
        raise ConfigError("cluster: several worker groups in one process need share_memory: true")


if __name__ == "__main__":
    sys.exit(main())
