"""A Caffe solver and its `.solverstate` as SINGA's updater conf and snapshot state.

Caffe's SGD keeps `h ← m·h + rate·lr_mult·(g + wd·decay_mult·w); w ← w − h`, SINGA's kSGD
`h ← m·h − lr·lr_scale·(g + wd·wd_scale·w); w ← w + h` (src/utils/updater.cc): the same rule
with SINGA's history the negative of Caffe's. Nesterov keeps the same sign in both. Learning
rate policies map to SINGA's generators where one computes the same rate:

    fixed      kFixed
    step       kStep        base·gamma^(iter div stepsize)
    exp        kStep        change_freq 1: base·gamma^iter
    inv        kInverse     base·(1 + gamma·iter)^(−power)
    multistep  kFixedStep   step 0, stepvalue…; step_lr base·gamma^k (its index: current_step)
    poly       kLinear      power 1 only: base·(1 − iter/max_iter)

Caffe does not save where its data layers stand: a resumed run reads from the start.
"""
import numpy as np

from singa.checkpoint import SnapshotState
from singa.errors import DataError
from singa.interop.caffe.netdef import Refused
from singa.proto import caffe_pb2, job_pb2

__all__ = ["job_fields", "snapshot_state", "DATA_POSITION_NOTE"]

DATA_POSITION_NOTE = ("Caffe's .solverstate does not hold its data layers' positions: "
                      "-resume reads the data from the start, as `caffe train -snapshot` does")


def job_fields(job, solver, path):
    """Set `job`'s updater, train_steps, test/display/checkpoint frequencies and seed from
    SolverParameter `solver` (read from `path`)."""
    def refuse(why):
        raise Refused(f"{path}: {why}")
    kind = solver.type or {caffe_pb2.SolverParameter.SGD: "SGD",
                           caffe_pb2.SolverParameter.NESTEROV: "Nesterov"}.get(
                               solver.solver_type, "other")
    if kind not in ("SGD", "Nesterov"):
        refuse(f"solver type {kind}: SINGA's updater of that name computes another rule "
               f"(SGD and Nesterov are imported)")
    if solver.regularization_type != "L2":
        refuse(f"regularization_type {solver.regularization_type} (SINGA decays L2)")
    if solver.clip_gradients >= 0:
        refuse("clip_gradients: Caffe scales by the global L2 norm, SINGA clips each value")
    if solver.iter_size != 1:
        refuse(f"iter_size {solver.iter_size}: SINGA does not accumulate gradients")
    u = job.updater
    u.type = job_pb2.kSGD if kind == "SGD" else job_pb2.kNesterov
    u.momentum = solver.momentum
    u.weight_decay = solver.weight_decay
    _lr(u.learning_rate, solver, refuse)
    job.train_steps = solver.max_iter
    if solver.test_iter:
        job.test_steps = solver.test_iter[0]
        job.test_freq = solver.test_interval
    job.disp_freq = solver.display
    if solver.snapshot:
        job.checkpoint_freq = solver.snapshot
    if solver.random_seed >= 0:
        job.seed = solver.random_seed


def _lr(lr, s, refuse):
    policy = s.lr_policy
    lr.base_lr = s.base_lr
    if policy == "fixed":
        lr.type = job_pb2.kFixed
    elif policy == "step":
        lr.type = job_pb2.kStep
        lr.step_conf.gamma, lr.step_conf.change_freq = s.gamma, s.stepsize
    elif policy == "exp":
        lr.type = job_pb2.kStep
        lr.step_conf.gamma, lr.step_conf.change_freq = s.gamma, 1
    elif policy == "inv":
        lr.type = job_pb2.kInverse
        lr.inverse_conf.gamma, lr.inverse_conf.pow = s.gamma, s.power
    elif policy == "multistep":
        lr.type = job_pb2.kFixedStep
        steps = [0] + list(s.stepvalue)
        lr.fixedstep_conf.step.extend(steps)
        lr.fixedstep_conf.step_lr.extend(
            float(np.float32(s.base_lr * s.gamma ** k)) for k in range(len(steps)))
    elif policy == "poly" and s.power == 1:
        lr.type = job_pb2.kLinear
        lr.linear_conf.final_lr, lr.linear_conf.change_freq = 0, s.max_iter
    else:
        refuse(f"lr_policy \"{policy}\"" + (f" with power {s.power}" if policy == "poly" else "")
               + " has no SINGA learning-rate generator")


def snapshot_state(state, history, params, updater_type, path):
    """SnapshotState of SolverState `state` with its `history` ([Blob], Caffe's learnable
    params in order) for `params` (translate.Param, the same order first); the history of
    each param goes to the updater state under its stored name, negated for SGD."""
    learned = [p for p in params if p.trained]
    if history and len(history) != len(learned):
        raise DataError(f"{path}: {len(history)} history blobs for the net's {len(learned)} "
                        f"learnable params")
    sign = np.float32(-1 if updater_type == job_pb2.kSGD else 1)
    buffers = {}
    for p, h in zip(learned, history):
        if h.values.size != int(np.prod(p.shape)):
            raise DataError(f"{path}: history of {p.name} has {h.values.size} values, the param "
                            f"{'x'.join(map(str, p.shape))}")
        buffers[p.stored] = [np.multiply(h.values.reshape(p.shape), sign)]
    for p in params:
        if p.blob is None and history:
            buffers[p.stored] = [np.zeros(p.shape, np.float32)]
    if state.iter < 0:
        raise DataError(f"{path}: iteration {state.iter} is negative")
    return SnapshotState(step=state.iter, nworkers=1, lr_index=state.current_step,
                         param_state=buffers)

