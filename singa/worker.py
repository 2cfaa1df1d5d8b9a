"""Worker: the training loop and TrainOneBatch algorithms (SINGA's BPWorker / BPTTWorker / CDWorker, src/worker.cc).

The loop, per step: validate? test? checkpoint? TrainOneBatch; display?  Params travel to the
servers through the stub: Put (initial values), Get, Update (gradients); RGet / RUpdate answers
bring the new version, and `collect` waits for it before a param is used again.
"""
import logging
import threading

from singa.comm import msg as m
from singa.comm.socket import Dealer
from singa.errors import ClusterError
from singa.layers.rbm import RBMHidLayer, RBMVisLayer
from singa.layers.rnn import GRULayer, RNNDummyLayer
from singa.proto import job_pb2

log = logging.getLogger("singa")

kTrain, kVal, kTest = job_pb2.kTrain, job_pb2.kVal, job_pb2.kTest
kForward, kBackward, kAggGrad = job_pb2.kForward, job_pb2.kBackward, job_pb2.kAggGrad
kPositive, kNegative = job_pb2.kPositive, job_pb2.kNegative
STUB = m.addr(-1, -1, m.kStub)


def every(freq, after, step):
    """SINGA's XxxNow(step): freq > 0 and step >= after and (step - after) % freq == 0."""
    return freq > 0 and step >= after and (step - after) % freq == 0


def worker_class(job):
    """The Worker class of the job's train_one_batch algorithm (kBP when unset, as for -test)."""
    return {job_pb2.kCD: CDWorker, job_pb2.kBPTT: BPTTWorker}.get(job.train_one_batch.alg, Worker)


class Worker:
    """One worker thread of group `grp`, id `id` (its partition of the net); trains with kBP.

    `hooks` is the driver's side of the loop: `init_params(worker)`, `checkpoint(worker, step)`,
    `joined(worker)` / `left(worker)` (ZooKeeper membership), `tested(worker, step, metrics)`.
    """

    def __init__(self, ctx, endpoint, grp, id_, job, train_net, test_net=None, val_net=None,
                 hooks=None, response_timeout=120.0):
        self.grp, self.id = grp, id_
        self.address = m.addr(grp, id_, m.kWorkerParam)
        self.dealer = Dealer(ctx, self.address, endpoint)
        self.job = job
        self.train_net, self.test_net, self.val_net = train_net, test_net, val_net
        self.hooks = hooks
        self.step = job.step
        #: the resumed snapshot was taken after its step's test/validation/checkpoint: skip them
        self.resumed_evaluated = False
        self.params_by_id = {p.id: p for p in train_net.params}
        self.abort = threading.Event()
        self.error = None
        self.poll_ms = job.cluster.poll_time
        self.response_timeout = response_timeout

    # --- the loop -------------------------------------------------------------------------
    def run(self):
        job = self.job
        log.info("Worker (group = %d, id = %d)  start on CPU", self.grp, self.id)
        try:
            self.hooks.joined(self)
            self.hooks.init_params(self)
            while self.step < job.train_steps:
                s = self.step
                evaluate = not (self.resumed_evaluated and s == job.step)
                if evaluate and self.val_net and job.validate_steps > 0 \
                        and every(job.validate_freq, job.validate_after, s):
                    self.collect_all()
                    log.info("Validation @ step %d", s)
                    self.test(job.validate_steps, kVal, self.val_net)
                if evaluate and self.test_net and job.test_steps > 0 \
                        and every(job.test_freq, job.test_after, s):
                    self.collect_all()
                    log.info("Test @ step %d", s)
                    metrics = self.test(job.test_steps, kTest, self.test_net)
                    self.hooks.tested(self, s, metrics)
                if evaluate and self.grp == 0 and every(job.checkpoint_freq, job.checkpoint_after, s):
                    self.collect_all()
                    self.hooks.checkpoint(self, s)
                self.train_one_batch(s)
                if self.grp == 0 and self.id == 0 and every(job.disp_freq, job.disp_after, s):
                    self.display(kTrain | kForward | kBackward, f"Train @ step {s}",
                                 self.train_net)
                self.step += 1
            self.collect_all()   # SINGA's final checkpoint can miss the last update; ours waits
            if self.grp == 0:
                self.hooks.checkpoint(self, self.step, final=True)
        except Exception as e:   # reported by the driver, which then stops the job
            self.error = e
            if not isinstance(e, AbortedError):
                log.debug("worker failed", exc_info=True)
        finally:
            self.hooks.left(self)
            self.dealer.send(m.Msg(self.address, STUB, m.kStop))
            log.info("Worker (group = %d, id = %d) stops", self.grp, self.id)

    def train_one_batch(self, step):
        """kBP: Forward (collecting fresh params) then Backward, updating each layer's params."""
        net = self.train_net
        flag = kTrain | kForward
        for layer in net.layers:
            if layer.unroll_index == 0:
                for p in layer.params:
                    self.collect(p)
            layer.compute_feature(flag, net.srclayers[layer.name])
        flag = kTrain | kBackward
        for layer in reversed(net.layers):
            layer.compute_gradient(flag, net.srclayers[layer.name])
            for p in layer.params:
                self.update(step, p)

    @staticmethod
    def test_one_batch(phase, net, step):
        """Forward `net` for test batch `step` (0, 1, ... within one test)."""
        net.forward(phase | kForward)

    def test(self, nsteps, phase, net):
        """Run `nsteps` test batches of `net`; display and return the metrics."""
        for step in range(nsteps):
            self.test_one_batch(phase, net, step)
        return self.display(phase, " ", net)

    def display(self, flag, prefix, net):
        """Log `prefix  <metrics>` per layer with metrics; return {metric name: value}."""
        metrics = {}
        for line in net.display(flag):
            log.info("%s  %s", prefix, line)
            metrics.update((k.lower(), v) for k, v in parse_metrics(line).items())
        return metrics

    # --- params ---------------------------------------------------------------------------
    def put(self, p):
        self.dealer.send(m.Msg(self.address, STUB, m.kPut, m.param_trgt(p.owner, 0), p.version))

    def get(self, step, p):
        if p.version < step:
            p.last_version = p.version
            self.dealer.send(m.Msg(self.address, STUB, m.kGet, m.param_trgt(p.owner, 0), step))

    def update(self, step, p):
        p.last_version = p.version
        self.dealer.send(m.Msg(self.address, STUB, m.kUpdate, m.param_trgt(p.owner, 0), step))

    def collect(self, p):
        """Wait until an RGet/RUpdate has brought `p` a version newer than its last request."""
        waited = 0.0
        while p.version <= p.last_version:
            msg = self.dealer.receive(self.poll_ms)
            if msg is None:
                if self.abort.is_set():
                    raise AbortedError()
                waited += self.poll_ms / 1000
                if waited > self.response_timeout:
                    raise ClusterError(f"worker ({self.grp}, {self.id}): no answer for param "
                                       f"'{p.name}' from its server in {self.response_timeout:.0f} s")
                continue
            self.handle(msg)

    def collect_all(self):
        for layer in self.train_net.layers:
            if layer.unroll_index == 0:
                for p in layer.params:
                    self.collect(p)

    def handle(self, msg):
        if msg.type in (m.kRUpdate, m.kRGet):
            self.params_by_id[m.param_id(msg.trgt_val)].version = msg.trgt_version


class CDWorker(Worker):
    """kCD (SINGA's CDWorker): contrastive divergence on the RBM layers of the net.

    Only RBM params are updated; the layers below (a frozen stack loaded by checkpoint_path)
    only compute features, and `collect` never waits for their versions, which stay put.
    W has two shares, RBMVis's (its gradient) and RBMHid's (zero); the server averages the
    shares, as SINGA's does, so W moves at half the learning rate of the biases.
    """

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
                self.update(step, p)

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
                self.update(step, p)

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

    def display(self, flag, prefix, net):
        """Log `prefix  <metrics>` per layer with metrics, each averaged over the layer's
        unrolled copies; return {metric name: value}."""
        copies = {}
        for layer in net.layers:
            line = layer.to_string(flag)
            if line:
                copies.setdefault(layer.name.partition("#")[2], []).append(parse_metrics(line))
        metrics = {}
        for values in copies.values():
            mean = {k: sum(v[k] for v in values) / len(values) for k in values[0]}
            log.info("%s  %s", prefix, ", ".join(f"{k} = {v:f}" for k, v in mean.items()))
            metrics.update((k.lower(), v) for k, v in mean.items())
        return metrics


def parse_metrics(line):
    """{name: value} of a display line `Loss = 2.1, accuracy = 0.3`."""
    metrics = {}
    for item in line.split(","):
        name, _, value = item.partition("=")
        try:
            metrics[name.strip()] = float(value)
        except ValueError:
            pass
    return metrics


class AbortedError(Exception):
    """The driver stopped this worker because another executor failed."""
