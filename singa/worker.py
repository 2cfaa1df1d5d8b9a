"""Worker: the training loop and TrainOneBatch algorithms (SINGA's BPWorker / CDWorker, src/worker.cc).

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
from singa.proto import job_pb2

log = logging.getLogger("singa")

kTrain, kVal, kTest = job_pb2.kTrain, job_pb2.kVal, job_pb2.kTest
kForward, kBackward = job_pb2.kForward, job_pb2.kBackward
kPositive, kNegative = job_pb2.kPositive, job_pb2.kNegative
STUB = m.addr(-1, -1, m.kStub)


def every(freq, after, step):
    """SINGA's XxxNow(step): freq > 0 and step >= after and (step - after) % freq == 0."""
    return freq > 0 and step >= after and (step - after) % freq == 0


def worker_class(job):
    """The Worker class of the job's train_one_batch algorithm (kBP when unset, as for -test)."""
    return CDWorker if job.train_one_batch.alg == job_pb2.kCD else Worker


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
    def test_one_batch(phase, net):
        net.forward(phase | kForward)

    def test(self, nsteps, phase, net):
        """Run `nsteps` test batches of `net`; display and return the metrics."""
        for _ in range(nsteps):
            self.test_one_batch(phase, net)
        return self.display(phase, " ", net)

    def display(self, flag, prefix, net):
        """Log `prefix  <metrics>` per layer with metrics; return {metric name: value}."""
        metrics = {}
        for line in net.display(flag):
            log.info("%s  %s", prefix, line)
            for item in line.split(","):
                name, _, value = item.partition("=")
                try:
                    metrics[name.strip().lower()] = float(value)
                except ValueError:
                    pass
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
    def test_one_batch(phase, net):
        """Positive pass of every layer, then one reconstruction (kNegative|kTest) by RBMVis."""
        for layer in net.layers:
            layer.compute_feature(kPositive, net.srclayers[layer.name])
        for layer in net.layers:
            if isinstance(layer, RBMVisLayer):
                layer.compute_feature(kNegative | kTest, net.srclayers[layer.name])


class AbortedError(Exception):
    """The driver stopped this worker because another executor failed."""
