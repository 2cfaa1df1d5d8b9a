"""One test or validation pass over a net (the Worker's and `-test`'s): SINGA's `test_steps`
batches, or, when the net's store inputs set store_conf.whole_pass, every record of their
stores exactly once.

A whole pass reads from the first record in ceil(N / B) steps: N // B full batches, then,
when B does not divide N, one batch of the last N mod B records, run on a second net built
with that batch size (sharing the params). Its metrics join the full batches' weighted by
their rows, so a per-sample mean (loss, accuracy) is that of the N samples.
"""
import dataclasses
import logging

from singa import checkpoint, device
from singa.device import CPU
from singa.errors import ConfigError, DataError
from singa.io.store import count_records
from singa.layers.input import StoreInputLayer
from singa.net.neuralnet import NeuralNet
from singa.net.numerics import TEST, WORKERS, seeds
from singa.proto import job_pb2

log = logging.getLogger("singa")

__all__ = ["WholePass", "eval_net", "loaded_test_net", "run", "pass_steps"]


@dataclasses.dataclass
class WholePass:
    """`records` read in `full` batches of `batch`, then `tail` (a net of the `records` mod
    `batch` rows left, or None)."""
    records: int
    batch: int
    full: int
    tail: NeuralNet | None


def eval_net(net_conf, phase, rng, share_from=None, num_partitions=1, first_id=0,
             device=CPU):
    """The NeuralNet of `phase` (arguments as NeuralNet's), with `whole_pass` (a WholePass, or
    None when its inputs read SINGA's way)."""
    net = NeuralNet(net_conf, phase, rng, share_from, num_partitions, first_id, device)
    net.whole_pass = None
    inputs = [layer for layer in net.input_layers() if isinstance(layer, StoreInputLayer)
              and layer.conf.store_conf.whole_pass]
    if not inputs:
        return net
    records, batch = _shape_of_pass(net, inputs)
    full, rows = divmod(records, batch)
    tail = None
    if rows:
        if num_partitions > 1:
            raise ConfigError(
                f"layer '{inputs[0].name}': a whole pass over {records} records in batches of "
                f"{batch} ends with a batch of {rows}, which {num_partitions} workers of a "
                f"group cannot share; give a batch size that divides {records}")
        conf = job_pb2.NetProto()
        conf.CopyFrom(net_conf)
        for ly in conf.layer:
            if ly.store_conf.whole_pass:
                del ly.store_conf.batchsize[:]
                ly.store_conf.batchsize.append(rows)
        tail = NeuralNet(conf, phase, rng, share_from or net, 1, net.next_id, device)
        net.next_id = tail.next_id
    net.whole_pass = WholePass(records, batch, full, tail)
    return net


def loaded_test_net(job, what, net_conf=None):
    """The kTest net of `job` (of NetProto `net_conf`, by default the job's), drawing from the
    job's test stream, each of its params loaded by name from the job's `checkpoint_path`:
    (net, the CheckpointReaders read). ConfigError when the job names no file or a param is in
    none of them; `what` ("-test", "predict") names the caller in the message. It runs where
    a process's first worker would (`gpu`)."""
    place = device.of_workers(job.gpu, [0])[0]
    net = eval_net(net_conf or job.neuralnet, job_pb2.kTest, seeds(job, WORKERS)[TEST],
                   device=place)
    owners = {p.name: p for p in net.owner_params}
    files, loaded = checkpoint.load_checkpoint_path(job, owners, log.warning, log.info)
    if not files:
        raise ConfigError(f"{what} needs checkpoint_path in the job conf (a file, 'latest' or "
                          f"'best')")
    missing = [n for n in owners if n not in loaded]
    if missing:
        raise ConfigError(f"{what}: params {', '.join(missing)} are in none of the "
                          f"checkpoint_path files ({', '.join(r.path for r in files)})")
    log.info("%s", checkpoint.loaded_line(files, owners, loaded))
    return net, files


def pass_steps(records, batch):
    """The steps of a whole pass over `records` in batches of `batch`: ceil(records / batch)."""
    return -(-records // batch)


def run(net, phase, nsteps, one_batch):
    """Forward `net` through one test or validation: `one_batch(phase, net, i)` for
    i < `nsteps`, or, for a whole-pass net, its full batches from the first record and then its
    tail, whose metrics `net`'s layers then hold too (weighted by rows)."""
    plan = getattr(net, "whole_pass", None)
    if plan is None:
        for i in range(nsteps):
            one_batch(phase, net, i)
        return
    for layer in net.input_layers():
        layer.seek(0, True)
    for i in range(plan.full):
        one_batch(phase, net, i)
    if plan.tail is None:
        return
    tail = plan.tail
    for layer in tail.input_layers():
        layer.seek(net.by_name[layer.name].position()[0], True)
    one_batch(phase, tail, plan.full)
    weight = (plan.records - plan.full * plan.batch) / plan.batch
    for name, values in tail.metrics(phase).items():
        net.by_name[name].add_metrics({k: v * weight for k, v in values.items()}, weight)


def _shape_of_pass(net, inputs):
    """(records, batch size) that every whole-pass input of `net` shares; ConfigError else."""
    others = [layer.name for layer in net.input_layers() if layer not in inputs]
    if others:
        raise ConfigError(f"layer '{inputs[0].name}' reads a whole pass but input layer "
                          f"'{others[0]}' of the same net does not: set whole_pass on both")
    shapes = {}
    for layer in inputs:
        conf, sc = layer.conf, layer.conf.store_conf
        batch = layer.data.shape[0]
        if conf.partition_dim == 0 and conf.num_partitions > 1:
            if len(sc.batchsize) > 1:
                raise ConfigError(f"layer '{layer.name}': a whole pass needs one batchsize "
                                  f"shared by the partitions, got {list(sc.batchsize)}")
            batch = sc.batchsize[0]
        try:
            records = count_records(layer.backend, layer.path)
        except OSError as e:
            raise DataError(f"{layer.path}: cannot read it: {e.strerror}") from None
        if records == 0:
            raise DataError(f"{layer.path}: the {layer.backend} store is empty")
        shapes[layer.name] = (records, batch)
    if len(set(shapes.values())) > 1:
        raise ConfigError("whole-pass inputs of one net differ in records or batch size: " +
                          ", ".join(f"'{n}' {r} records in batches of {b}"
                                    for n, (r, b) in shapes.items()))
    return next(iter(shapes.values()))
