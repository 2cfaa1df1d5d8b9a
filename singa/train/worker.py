"""Worker: the training loop and TrainOneBatch algorithms (SINGA's BPWorker / BPTTWorker /
CDWorker, src/worker.cc).

The loop, per step: validate? test? checkpoint? TrainOneBatch; display?  Params travel to the
servers through the stub as messages (`param_client.ParamClient`: Put, Get, Update of a bucket
of gradients, `BUCKET_FLOATS`); `collect` waits for the answers before a param is used again.
Every wait goes through one loop, `receive`, which handles what arrives (answers, the
channel's messages, a stop or a snapshot on signal) and drops bad traffic. The worker
initialises or loads its params, restores its own streams on a resume, and writes its own
snapshot file, asking the servers for the updater state by message (SINGA's
Worker::InitNetParams / Worker::Checkpoint).
"""
import logging
import math
import time

import numpy as np

from singa import checkpoint, resolve
from singa.comm import msg as m
from singa.comm.bridge import LayerChannel
from singa.comm.socket import Dealer
from singa.device import CPU, host
from singa.device import cuda_graphs
from singa.errors import ClusterError, executor_failure
from singa.job import topology
from singa.layers.connection import BridgeDstLayer, BridgeSrcLayer
from singa.layers.param import init_params
from singa.layers.rbm import RBMHidLayer, RBMVisLayer
from singa.layers.rnn import GRULayer, RNNDummyLayer
from singa.log import format_duration, format_metrics
from singa.net import numerics
from singa.proto import job_pb2
from singa.train import evaluation
from singa.train.monitor import Monitor
from singa.train.param_client import ANSWERS, ParamClient
from singa.train.place import Place
from singa.watch.metrics import unrolled_mean

log = logging.getLogger("singa")

kTrain, kVal, kTest = job_pb2.kTrain, job_pb2.kVal, job_pb2.kTest
kForward, kBackward, kAggGrad = job_pb2.kForward, job_pb2.kBackward, job_pb2.kAggGrad
kPositive, kNegative = job_pb2.kPositive, job_pb2.kNegative


#: a CPU worker sends its gradients in buckets of at least this many floats, so that a
#: bucket's updates run on the servers beside the backward pass of the layers below while
#: each message's cost stays small beside them (PyTorch DDP's gradient buckets); a GPU worker,
#: whose host only queues the GPU's work, sends all of a step's in one
BUCKET_FLOATS = 1 << 18


def every(freq, after, step):
    """SINGA's XxxNow(step): freq > 0 and step >= after and (step - after) % freq == 0."""
    return freq > 0 and step >= after and (step - after) % freq == 0


def worker_class(job):
    """The Worker class of the job's train_one_batch algorithm (kBP when unset, as for -test)."""
    return {job_pb2.kCD: CDWorker, job_pb2.kBPTT: BPTTWorker}.get(job.train_one_batch.alg, Worker)


class Worker:
    """One worker thread of group `grp`, id `id` (its partition of the net); trains with kBP.

    `init_rng` draws the initial values of the params this worker owns; `resume` is the
    Snapshot a -resume continues from, its files parsed (None: a fresh start); `place` is its
    process's `place.Place`: the worker joins and leaves its server group in its cluster
    runtime, and in a restarted process (`rejoin`) the worker's group joins a running job
    again and Gets every param from the servers. What it displays and the snapshots it
    writes also go to `reporter` (a `singa.watch.metrics.Reporter`, or None).
    In a group of several workers each runs its partition of the nets and talks to the others
    through a LayerChannel: bridge layers' blobs, and the metrics worker 0 displays for all.
    """

    #: a kBP step's gradient blobs share memory by when they are live (`grad_memory`: the
    #: runtime builds the train nets so); kCD's and kBPTT's steps use them otherwise
    shares_grad_memory = True

    def __init__(self, endpoint, grp, id_, job, train_net, test_net=None, val_net=None,
                 init_rng=None, resume=None, place=Place(), reporter=None,
                 response_timeout=120.0, device=CPU):
        self.grp, self.id = grp, id_
        self.device = device        # where its nets compute (`gpu`)
        self.address = m.addr(grp, id_, m.kWorkerParam)
        self.dealer = Dealer(self.address, endpoint)
        self.job = job
        self.train_net, self.test_net, self.val_net = train_net, test_net, val_net
        self.init_rng = init_rng
        self.resume = resume
        self.place = place
        self.reporter = reporter
        self.sgroup = topology.server_group(job.cluster, grp)
        self.folder = checkpoint.folder(resolve(job.cluster.workspace))
        self.step = job.step
        #: the resumed snapshot was taken after its step's test/validation/checkpoint: skip them
        self.resumed_evaluated = False
        self.who = f"Worker (group = {grp}, id = {id_})"      # in log lines
        #: the floats a bucket of gradients holds before it is sent: a step's on a GPU
        self.params = ParamClient(self.address, self.dealer, train_net.params,
                                  BUCKET_FLOATS if device.gpu is None else math.inf, self.who)
        #: the params this worker initialises, Puts and checkpoints: its partition's owners
        #: (a dim-0 copy only Gets the values of partition 0's)
        self.owned = train_net.owner_params
        self.channel = None
        if job.cluster.nworkers_per_group > 1:
            self.channel = LayerChannel(endpoint, grp, id_, self.dealer, self.receive,
                                        response_timeout, where=self.worker_where)
            for net in (train_net, test_net, val_net):
                for layer in net.layers if net is not None else ():
                    if isinstance(layer, (BridgeSrcLayer, BridgeDstLayer)):
                        layer.channel = self.channel
        self.displays = 0           # display calls so far: the key of their metric messages
        #: the latest test and validation, the best monitored value (restored on a resume)
        self.monitor = Monitor(job)
        self.snapshot_at = None     # a snapshot on signal: the step to stop at after it
        self.poll_ms = job.cluster.poll_time
        self.response_timeout = response_timeout
        self.loss_check = numerics.LossCheck(train_net)
        #: the train net's passes (on a GPU: runs of them as CUDA graphs)
        self.graphs = cuda_graphs.StepGraphs(train_net, device, capture=device.gpu is not None)

    # --- the loop -------------------------------------------------------------------------
    def run(self):
        job = self.job
        log.info("Worker (group = %d, id = %d)  start on %s", self.grp, self.id, self.device)
        try:
            self.device.use()
            if self.place.cluster_rt is not None:
                self.place.cluster_rt.join_sgroup(self.grp, self.id, self.sgroup)
            self.init_params()
            self.started = (time.monotonic(), self.step)
            while self.drain() < self.last_step():
                s = self.step
                evaluate = not (self.resumed_evaluated and s == job.step)
                if evaluate:
                    self.evaluate(s, lambda freq, after: every(freq, after, s))
                due = every(job.checkpoint_freq, job.checkpoint_after, s)
                if evaluate and self.grp == 0 and (self.monitor.improved(s) or due):
                    self.loss_check.flush()
                    self.collect_all()
                    self.checkpoint(s)
                self.train_one_batch(s)
                self.params.send_updates()
                self.loss_check.check(s)
                if (self.id == 0 or self.channel) and every(job.disp_freq, job.disp_after, s):
                    self.loss_check.flush()
                    self.report(s, "train", self.display(kTrain | kForward | kBackward,
                                                         f"Train @ step {s}", self.train_net))
                    if self.id == 0 and self.grp == 0:
                        log.info("Progress @ step %d: %s", s, self.pace(s))
                self.step += 1
            self.loss_check.flush()
            self.collect_all()   # SINGA's final checkpoint can miss the last update; ours waits
            if self.step < job.train_steps:
                log.info("Worker (group = %d, id = %d): stopping at step %d after a snapshot, "
                         "as asked", self.grp, self.id, self.step)
            elif job.test_at_end:
                self.evaluate_final()
            if self.grp == 0:
                self.checkpoint(self.step, final=True)
        except AbortedError:
            pass
        except Exception as e:   # the stub stops the job and reports it
            kind, text = executor_failure(e, f"Worker (group = {self.grp}, id = {self.id})")
            self.dealer.send(m.Msg(self.address, m.STUB, m.kError,
                                   frames=m.error_frames(kind, text)))
        finally:
            try:
                if self.place.cluster_rt is not None:
                    self.place.cluster_rt.leave_sgroup(self.grp, self.id, self.sgroup)
            finally:    # the stub waits for this stop, whatever leaving did
                self.dealer.send(m.Msg(self.address, m.STUB, m.kStop))
                log.info("Worker (group = %d, id = %d) stops", self.grp, self.id)

    def evaluate(self, step, due):
        """Validate, then test, at `step` where `due(freq, after)` says (SINGA's
        ValidateNow/TestNow), recording and reporting the metrics."""
        job = self.job
        for phase, name, net, steps, freq, after in (
                (kVal, "validation", self.val_net, job.validate_steps, job.validate_freq,
                 job.validate_after),
                (kTest, "test", self.test_net, job.test_steps, job.test_freq, job.test_after)):
            if net is None or steps <= 0 or not due(freq, after):
                continue
            self.loss_check.flush()
            self.collect_all()
            if self.id == 0:
                log.info("%s @ step %d", name.capitalize(), step)
            metrics = self.test(steps, phase, net)
            self.monitor.record(name, step, metrics, check=self.id == 0)
            self.report(step, name, metrics)

    def evaluate_final(self):
        """test_at_end: validate and test the params training ends with (at train_steps, where
        the loop never does), so that the last metrics are those of the params returned and of
        the final snapshot. The nets' streams stand afterwards where they stood before: a run
        resumed from the final snapshot tests as an unbroken longer run does."""
        nets = [net for _, net in self.named_nets()[1:]]
        saved = [net.streams() for net in nets]
        self.evaluate(self.step, lambda freq, after: freq > 0 and self.step >= after)
        for net, (rng, readers) in zip(nets, saved):
            net.restore_streams(rng, readers)

    def report(self, step, phase, metrics):
        """Worker 0 of each group reports (its group's metrics, averaged over the partitions);
        the others hold a copy of its averages, or nothing."""
        if self.reporter is not None and self.id == 0 and metrics:
            self.reporter.metrics(self.grp, step, phase, metrics)

    def train_one_batch(self, step):
        """kBP: Forward (collecting fresh params) then Backward, updating each layer's params:
        pass by pass, or on a GPU by segments of passes run as CUDA graphs (`cuda_graphs`),
        their params collected before and updated after."""
        for segment in self.graphs.segments:
            for layer, forward in segment.passes:
                if forward and layer.unroll_index == 0:
                    for p in layer.params:
                        self.collect(p)
            self.graphs.run(segment)
            for layer, forward in segment.passes:
                if not forward:
                    for p in layer.params:
                        self.params.update(step, p)
        self.graphs.steps += 1

    @staticmethod
    def test_one_batch(phase, net, step):
        """Forward `net` for test batch `step` (0, 1, ... within one test)."""
        net.forward(phase | kForward)

    def test(self, nsteps, phase, net):
        """Run `nsteps` test batches of `net` (or its whole pass); display and return the
        metrics."""
        evaluation.run(net, phase, nsteps, self.test_one_batch)
        return self.display(phase, " ", net)

    def pace(self, step):
        """`<r> steps/s, <t> left` after `step`: the rate since this run's first step (tests
        and snapshots included), the time to train_steps at that rate."""
        t0, s0 = self.started
        rate = (step + 1 - s0) / max(time.monotonic() - t0, 1e-9)
        left = format_duration((self.job.train_steps - step - 1) / rate)
        return f"{rate:.3g} steps/s, {left} left"

    def display(self, flag, prefix, net):
        """Log `prefix  <metrics>` per layer with metrics (group 0 only, as SINGA: the other
        groups' reach metrics.csv alone); return {metric name: value}.

        In a group of several workers, worker 0 logs and returns each metric averaged over the
        partitions (`LayerChannel.share_metrics`); the others log nothing and return {}, or,
        for a test or validation under checkpoint_on_improvement, worker 0's averages."""
        rows = self.metric_rows(flag, net)
        shown = self.grp == 0
        if self.channel is not None:
            self.displays += 1
            rows = self.channel.share_metrics(
                rows, self.displays, self.job.cluster.nworkers_per_group,
                self.job.checkpoint_on_improvement and not flag & kTrain)
            shown = shown and self.id == 0
        metrics = {}
        for values in rows:
            if shown:
                log.info("%s  %s", prefix, format_metrics(values))
            metrics.update((k.lower(), v) for k, v in values.items())
        return metrics

    @staticmethod
    def metric_rows(flag, net):
        """{metric name: value} of each layer of `net` with metrics (resets them)."""
        return list(net.metrics(flag).values())

    # --- params ---------------------------------------------------------------------------
    def init_params(self):
        """Worker::InitNetParams: the first worker group of each server group loads its owner
        params (from the resumed snapshot or `checkpoint_path`, by name), initialises the rest
        and Puts them (with the snapshot's updater state and LR index on a resume); every
        worker then Gets what it lacks."""
        resumed = self.resumed_state()
        if not self.place.rejoin and self.owned and \
                self.grp % topology.nworker_groups_per_server_group(self.job.cluster) == 0:
            loaded = checkpoint.load_owned(self.job, self.resume, self.owned, log, self.id == 0)
            # with several partitions every worker draws each param whole and keeps its piece
            init_params([p for p in self.owned if p.name not in loaded], self.init_rng,
                        self.job.step,
                        self.train_net.graph.params if self.channel is not None else None,
                        loaded)
            lr_index = resumed.lr_index if resumed is not None else -1
            for p in self.owned:
                bufs = checkpoint.updater_state(self.resume, p) if resumed is not None else []
                files = ", ".join(self.resume.files_holding(p.name)) if bufs else ""
                self.params.put(p, [np.ascontiguousarray(b, np.float32) for b in bufs],
                                lr_index, files)
            for p in self.owned:
                self.collect(p)
        self.resume = None     # frees the snapshot's file bytes (once every worker is done)
        for p in self.train_net.params:
            self.params.get(self.job.warmup_steps, p)

    def resumed_state(self):
        """The SnapshotState of the resumed snapshot (None: a fresh start, or a snapshot SINGA
        wrote, which holds values and versions only). A worker of group 0
        restores its streams and recorded metrics from it; other groups read other data
        (random_skip), so theirs start afresh. A worker beyond the snapshot's takes worker 0's
        file: dim-0 readers of every partition stand at the same place."""
        if self.resume is None:
            return None
        snap = self.resume.state_of(self.id)        # None for SINGA's own files
        if snap is not None and self.grp == 0:
            self.restore_streams(snap)
            self.monitor.restore(snap.metrics)
            self.resumed_evaluated = snap.evaluated
        return snap

    def streams(self):
        """({net name: RNG state}, {"net/layer": reader position}) of this worker's nets."""
        rng, reader = {}, {}
        for name, net in self.named_nets():
            rng[name], readers = net.streams()
            reader.update({f"{name}/{layer}": at for layer, at in readers.items()})
        return rng, reader

    def restore_streams(self, snap):
        """Each of this worker's nets continues its streams from SnapshotState `snap` (its
        readers from their start when the job reads new data: `new_data`)."""
        for name, net in self.named_nets():
            readers = {key.partition("/")[2]: at for key, at in snap.reader.items()
                       if key.partition("/")[0] == name and not self.job.new_data}
            net.restore_streams(snap.rng.get(name), readers)

    def named_nets(self):
        """The nets whose streams (RNG, readers) this worker saves: its own, test, validation."""
        nets = [("train", self.train_net)]
        nets += [(name, n) for name, n in (("test", self.test_net), ("validation", self.val_net))
                 if n is not None]
        return nets

    def checkpoint(self, step, final=False):
        """Worker::Checkpoint: write `step<step>-worker<id>.bin` with this worker's owner params
        and everything a bit-exact resume needs, the updater state asked of the servers.

        In the loop a snapshot follows its step's test and validation (`evaluated`); the final
        one, at train_steps, does not."""
        owners = self.owned
        numerics.check_params(owners, step)
        self.params.ask_states(owners, step)
        self.wait(lambda: len(self.params.states) == len(owners),
                  "the updater state of its params")
        param_state, lr_index = {}, 0
        for p in owners:
            lr_index, param_state[p.name] = self.params.states[p.owner]
        rng, reader = self.streams()
        snap = checkpoint.SnapshotState(
            step=step, param_state=param_state, rng=rng, reader=reader, lr_index=lr_index,
            nworkers=self.job.cluster.nworkers_per_group, metrics=self.monitor.recorded(),
            evaluated=not final)
        # a full disk: CheckpointError, the temporary file gone, older snapshots intact
        path = checkpoint.write_file(checkpoint.snapshot_file(self.folder, step, self.id),
                                     [(p.name, host(p.data), p.version, p.partition)
                                      for p in owners],
                                     snap)
        log.info("checkpoint to %s", path)
        if self.reporter is not None and self.id == 0:
            self.reporter.snapshot(step, path)
        if self.job.checkpoint_keep_newest:
            checkpoint.prune(self.folder, self.job.checkpoint_keep_newest,
                             self.job.checkpoint_keep_best, self.job.checkpoint_keep_best_k)

    def collect(self, p):
        """Wait until an answer has brought `p` a version newer than its last request."""
        if p.version <= p.last_version:
            self.wait(lambda: p.version > p.last_version, f"param '{p.name}'")

    def collect_all(self):
        for layer in self.train_net.layers:
            if layer.unroll_index == 0:
                for p in layer.params:
                    self.collect(p)

    def wait(self, done, what):
        """Handle messages until `done()` (the bucket of gradients sent first); ClusterError
        after `response_timeout` seconds."""
        self.params.send_updates()
        self.receive(done, self.response_timeout, lambda: (
            f"worker ({self.grp}, {self.id}): no answer for {what} from its servers "
            f"({self.servers_where()}) in {self.response_timeout:.0f} s"))

    def receive(self, done, timeout, late):
        """The worker's one loop over its inbox: handle each message (bad traffic dropped with
        a warning) until `done()`; ClusterError(`late()`) after `timeout` seconds without
        (None: until no message is waiting)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            msg = self.dealer.receive(0 if deadline is None else self.poll_ms)
            if msg is not None:
                try:
                    self.handle(msg)
                except ClusterError as e:   # bad traffic: dropped
                    log.warning("%s: dropped %r: %s", self.who, msg, e)
            elif deadline is None:
                return
            if deadline is not None and not done() and time.monotonic() > deadline:
                raise ClusterError(late())

    def servers_where(self):
        """Where this worker's servers run: 'process P at host:port' each (for an error)."""
        cl = self.job.cluster
        return ", ".join(self.place.where(pid) for pid in sorted(
            {topology.server_procs(cl, self.sgroup, s) for s in range(cl.nservers_per_group)}))

    def worker_where(self, peer):
        """Where worker (grp, peer) of this group runs (for a bridge layer's time-out)."""
        return self.place.where(topology.worker_procs(self.job.cluster, self.grp, peer))

    def drain(self):
        """Handle the messages waiting (a snapshot on signal among them); returns the step."""
        self.receive(lambda: False, None, None)
        return self.step

    def last_step(self):
        """The step the loop ends before: train_steps, or the step of a snapshot on signal."""
        if self.snapshot_at is None:
            return self.job.train_steps
        return min(self.job.train_steps, max(self.snapshot_at, self.step))

    def handle(self, msg):
        if self.channel is not None and self.channel.is_for(msg):
            self.channel.keep(msg)
            return
        if msg.type == m.kStop:
            raise AbortedError()
        if msg.type == m.kSnapshot:
            self.snapshot_at = max(self.snapshot_at or 0, msg.trgt_version)
            return
        if msg.type not in ANSWERS:
            log.warning("%s: dropped %r", self.who, msg)
            return
        self.params.answer(msg)


class CDWorker(Worker):
    """kCD (SINGA's CDWorker): contrastive divergence on the RBM layers of the net.

    Only RBM params are updated; the layers below (a frozen stack loaded by checkpoint_path)
    only compute features, and `collect` never waits for their versions, which stay put.
    W has two shares, RBMVis's (its gradient) and RBMHid's (zero); the server averages the
    shares, as SINGA's does, so W moves at half the learning rate of the biases.
    """

    shares_grad_memory = False

    def train_one_batch(self, step):
        """Positive pass of every layer, cd_k Gibbs steps of the RBM layers (the first one
        adds the reconstruction error), then their gradients and updates."""
        net = self.train_net
        for layer in net.layers:
            for p in layer.params:
                self.collect(p)
            layer.compute_feature(kPositive, net.srclayers[layer.name])
        rbms = [layer for layer in net.layers if isinstance(layer, (RBMVisLayer, RBMHidLayer))]
        for layer in rbms:
            layer.compute_feature(kNegative | kTest, net.srclayers[layer.name])
        for _ in range(self.job.train_one_batch.cd_conf.cd_k - 1):
            for layer in rbms:
                layer.compute_feature(kNegative, net.srclayers[layer.name])
        for layer in rbms:
            layer.compute_gradient(kTrain, net.srclayers[layer.name])
            for p in layer.params:
                self.params.update(step, p)

    @staticmethod
    def test_one_batch(phase, net, step):
        """Positive pass of every layer, then one reconstruction (kNegative|kTest) by RBMVis."""
        for layer in net.layers:
            layer.compute_feature(kPositive, net.srclayers[layer.name])
        for layer in net.layers:
            if isinstance(layer, RBMVisLayer):
                layer.compute_feature(kNegative | kTest, net.srclayers[layer.name])


class BPTTWorker(Worker):
    """kBPTT (SINGA's BPTTWorker): back-propagation through a net unrolled over `unroll_len`.

    Copy i > 0 of a layer shares its params' values and gradients with copy 0, so the
    gradients are zeroed before the forward pass, every copy adds its part (kAggGrad), and only
    copy 0's params are sent to the servers once the whole backward pass is done. Display
    averages each metric over a layer's unrolled copies (SINGA sums them).
    """

    shares_grad_memory = False

    def train_one_batch(self, step):
        net = self.train_net
        firsts = [layer for layer in net.layers if layer.unroll_index == 0]
        for layer in net.layers:
            if layer.unroll_index == 0:
                for p in layer.params:
                    self.collect(p)
                    p.grad.fill(0)
            layer.compute_feature(kTrain | kForward, net.srclayers[layer.name])
        for layer in reversed(net.layers):
            layer.compute_gradient(kTrain | kBackward | kAggGrad, net.srclayers[layer.name])
        for layer in firsts:
            for p in layer.params:
                self.params.update(step, p)

    @staticmethod
    def test_one_batch(phase, net, step):
        """Forward; in a sampling net (an RNNDummy with a dynamic_srclayer), from test batch 1
        on, each RNNDummy reads its dynamic_srclayer (the previous sample) and the first copy
        of each GRU without a state source continues from its last copy's state (SINGA's
        `full_state`, which SINGA 0.3 leaves off: its samples see one character)."""
        sampling = step > 0 and phase & kTest and any(
            isinstance(layer, RNNDummyLayer) and layer.dynamic_srclayer for layer in net.layers)
        for layer in net.layers:
            srcs = net.srclayers[layer.name]
            if sampling and isinstance(layer, RNNDummyLayer) and layer.dynamic_srclayer:
                srcs = [net.dynamic_srclayer(layer)]
            elif sampling and isinstance(layer, GRULayer) and layer.unroll_index == 0 \
                    and len(srcs) == 1:
                srcs = srcs + [net.last_unroll_layer(layer)]
            layer.compute_feature(phase | kForward, srcs)

    @staticmethod
    def metric_rows(flag, net):
        """{metric name: value} per layer with metrics, each averaged over its unrolled copies."""
        return unrolled_mean(net.metrics(flag))


class AbortedError(Exception):
    """The driver stopped this worker because another executor failed."""

