"""Where a training run from Python continues: `fit(resume=True)` from the newest snapshot of
the workspace, a second `fit` of a model from the params the first left. The snapshot is found
and verified once, here (its files parsed), and handed on: the session and its workers read no
other."""
import os

import numpy as np

from singa import checkpoint
from singa.device.footprint import SHAPES
from singa.errors import CheckpointError, ConfigError
from singa.naming import is_unrolled, unrolled
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2


def continue_from(job, params, same_data):
    """A next fit of a model whose params (its last fit's, or those `load_model` read) are the
    checkpoint file `params` (None: afresh): `job` trains its train_steps more from their
    step (returned), its displays, validations and tests counted from there too (`*_after`:
    each pass's end with epochs), reading data other than the last fit's (not `same_data`)
    from their start."""
    if params is None:
        return None
    start = checkpoint.parse_step_worker(os.path.basename(params))[0]
    job.train_steps += start
    job.disp_after += start
    job.validate_after += start
    job.test_after += start
    job.new_data = not same_data
    return start


def resume_point(job, resume, start=None, params=None):
    """The snapshot the prepared `job` continues from, checked, or None: with `resume`, the
    newest in its workspace (None: a fresh start), which must leave steps to train; else, for
    a next fit whose params are those of step `start` (`continue_from`), the checkpoint
    file `params`, that snapshot, wherever it is (a saved model's folder; an older one of
    the workspace, as EarlyStopping's restore_best_weights leaves: the run goes on from it as
    a run of its own, `checkpoint.start_run`, so that a resume continues it). A workspace
    without a checkpoint folder is a CheckpointError here, as fit has always had it
    (`newest_snapshot`: none)."""
    if not resume and start is None:
        return None
    folder = checkpoint.folder(job.cluster.workspace)
    if start is not None:
        where = os.path.dirname(os.path.abspath(params))
        snap = checkpoint.snapshot_at(where, start)
        if where == folder and any(sw[0] > start for sw in map(
                checkpoint.parse_step_worker, os.listdir(folder)) if sw):
            checkpoint.start_run(folder)
        return check_resumable(job, snap)
    snap = checkpoint.latest_snapshot(folder, job.cluster.nworkers_per_group, this_run=True)
    if resume and snap is not None and snap.step >= job.train_steps:
        raise ConfigError(f"fit(resume=True): the newest snapshot is at step {snap.step}, "
                          f"and nb_epoch {job.train_steps} (the step to reach) leaves "
                          f"nothing to train: give nb_epoch > {snap.step}")
    return check_resumable(job, snap)


def newest_snapshot(job):
    """The newest complete snapshot of `job`'s workspace (resume's own rule), its files parsed
    and verified, or None."""
    folder = checkpoint.folder(job.cluster.workspace)
    if not os.path.isdir(folder):
        return None
    return checkpoint.latest_snapshot(folder, job.cluster.nworkers_per_group, this_run=True)


def check_resumable(job, snap):
    """`snap` (`newest_snapshot`'s, or None), which a resume of `job` starts from: it must
    hold every param of the job's net, else the job would start afresh under the "Resume"
    line and write over it (a net whose params are named otherwise: another model, or one
    whose generated names differ): CheckpointError naming the missing params. The net's
    params are learnt by setting it up on SHAPES: nothing is allocated."""
    if snap is None:
        return None
    stored = snap.names()
    stored |= {unrolled(name) for name in stored if not is_unrolled(name)}     # SINGA 0.1's names
    net = NeuralNet(job.neuralnet, job_pb2.kTrain, np.random.default_rng(0), device=SHAPES)
    missing = [p.name for p in net.owner_params if p.name not in stored]
    if missing:
        shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
        folder = checkpoint.folder(job.cluster.workspace)
        raise CheckpointError(
            f"resume: the newest snapshot {checkpoint.snapshot_file(folder, snap.step, 0)} "
            f"(step {snap.step}) "
            f"lacks {len(missing)} of the {len(net.owner_params)} params of '{job.name}' "
            f"({shown}): it is another net's; resume in this net's workspace, or train "
            f"without resume (which writes over it)")
    return snap
