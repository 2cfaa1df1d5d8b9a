"""bin/singa-import.sh caffe: a Caffe net (and weights, solver, solver state) as a SINGA job.

    singa-import.sh caffe NET.prototxt [WEIGHTS.caffemodel] [-solver SOLVER.prototxt]
                    [-solverstate FILE.solverstate] [-input_shape C,H,W] [-fold-bn] -o DIR

NET may be the solver itself (its `net` names the net, relative to the solver's folder).
Writes DIR/job.conf and, with weights, DIR/checkpoint/step<iter>-worker0.bin and its .meta
(iter from the solver state, else 0); data files DIR/data/*.kvfile (the mean image; the
records themselves the user writes there). -fold-bn folds BatchNorm layers of global
statistics (and their Scale) into the Convolution before them (translate.translate). A net
whose TRAIN net Caffe cannot build (its only data layer `include { phase: TEST }`) is a
test-only job: train_steps 0 and test_steps the solver's test_iter, else `caffe test`'s
default -iterations, for `singa-run.sh -test`. Exit 2 with one line for anything refused.
"""
import argparse
import os
import sys

from google.protobuf import text_format

from singa.checkpoint import SnapshotState, snapshot_file, write_file
from singa.checkpoint import folder as checkpoint_folder
from singa.cluster import launch
from singa.errors import (ArgumentParser, CheckpointError, ConfigError, DataError,
                          run_command)
from singa.files import write_atomic
from singa.interop.caffe import netdef
from singa.interop.caffe.solverstate import DATA_POSITION_NOTE, job_fields, snapshot_state
from singa.interop.caffe.translate import translate
from singa.io.caffe_blobs import CaffeFile
from singa.io.kvfile import pack
from singa.job import config, workspace
from singa.proto import caffe_pb2, job_pb2
from singa.train.updater import create_lr_generator

__all__ = ["main", "import_caffe", "CAFFE_TEST_ITERATIONS"]

#: `caffe test`'s default -iterations: the batches a test-only job without a solver tests
CAFFE_TEST_ITERATIONS = 50


def main(argv=None):
    return run_command(lambda: import_caffe(**_args(argv)))


def _args(argv):
    """import_caffe's keywords from the command line."""
    ap = ArgumentParser(prog="singa-import.sh", usage=(
        "singa-import.sh caffe NET.prototxt [WEIGHTS.caffemodel] [-solver FILE] "
        "[-solverstate FILE] [-input_shape C,H,W] [-fold-bn] -o DIR"))
    ap.add_argument("format", choices=["caffe"])
    ap.add_argument("net", metavar="NET.prototxt", help="the net, or the solver (its `net`)")
    ap.add_argument("weights", metavar="WEIGHTS.caffemodel", nargs="?")
    ap.add_argument("-solver", metavar="FILE")
    ap.add_argument("-solverstate", metavar="FILE")
    ap.add_argument("-input_shape", metavar="C,H,W", type=_shape)
    ap.add_argument("-fold-bn", dest="fold_bn", action="store_true")
    ap.add_argument("-o", dest="out", metavar="DIR", required=True)
    args = vars(ap.parse_args(argv))
    del args["format"]
    return args


def _shape(text):
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) <= 0:
        raise argparse.ArgumentTypeError(f"give positive sizes C,H,W, not {text!r}")
    return shape


def import_caffe(net, out, weights=None, solver=None, solverstate=None, input_shape=None,
                 fold_bn=False, print=print):
    """Import as the module docstring says; returns the path of the job.conf written."""
    out = os.path.abspath(out)
    if fold_bn and solverstate is not None:
        raise ConfigError(f"{solverstate}: -fold-bn makes an inference net; it does not go "
                          f"with -solverstate")
    if solver is not None:
        solver_msg, solver_path = netdef.read_text(solver, caffe_pb2.SolverParameter()), solver
    else:
        solver_msg = _as_solver(net)
        solver_path, net = (net, None) if solver_msg is not None else (None, net)
    net_msg, net_path = _net_of(net, solver_msg, solver_path)

    state, history, state_file = None, [], None
    if solverstate is not None:
        if solver_msg is None:
            raise ConfigError(f"{solverstate}: a solver state needs its solver (-solver FILE, "
                              f"or the solver as NET) for the learning-rate policy")
        state_file = CaffeFile(solverstate)
        state, history = state_file.solver_state()
        if weights is None and state.learned_net:
            weights = netdef.relative_to(solverstate, state.learned_net)
        if weights is None:
            raise ConfigError(f"{solverstate}: names no learned_net; give the weights "
                              f"(WEIGHTS.caffemodel) it goes with")
    model = CaffeFile(weights) if weights is not None else None
    try:
        blobs = None
        if model is not None:
            _, blobs = model.net()
        t = translate(net_msg, net_path, blobs, weights, os.path.join(out, workspace.DATA),
                      input_shape, fold_bn, test=solver_msg is None or bool(solver_msg.test_iter))
        test_only = netdef.TRAIN not in t.phases
        if test_only and state is not None:
            raise ConfigError(f"{solverstate}: a solver state continues a training, but "
                              f"{net_path} has no TRAIN net (see its data layers)")
        job = _job(net_msg, t, out, solver_msg, solver_path)
        step = state.iter if state is not None else 0
        if model is not None:
            job.checkpoint_path.append(snapshot_file(checkpoint_folder(out), step, 0))
        text = text_format.MessageToString(job)
        config.parse_job(text, os.path.join(out, workspace.JOB_CONF), check_paths=False)
        launch.check_memory(job, net_path)
        snap = SnapshotState(step=step, nworkers=1)
        if state is not None:
            fresh = next((p.layer for p in t.params if p.blob is not None and
                          p.layer not in blobs), None)
            if fresh is not None:
                raise DataError(f"{solverstate}: a solver state continues the training of its "
                                f"weights, but {weights} has none for layer '{fresh}'")
            snap = snapshot_state(state, history, t.params, job.updater.type, solverstate)
            try:
                create_lr_generator(job.updater.learning_rate).set_index(snap.lr_index)
            except CheckpointError as e:
                raise DataError(f"{solverstate}: current_step {state.current_step}: {e}") from None
            if job.updater.type == job_pb2.kSGD and job.updater.momentum == 0:
                snap.param_state = {}
        # everything is checked: now the files, each whole or not at all
        os.makedirs(os.path.join(out, workspace.DATA), exist_ok=True)
        for path, tuples in t.files.items():
            write_atomic(path, lambda f: f.write(b"".join(pack(k, v) for k, v in tuples)))
        if model is not None:
            _write_checkpoint(job.checkpoint_path[0], t.params, blobs, step, snap)
        head = (f"# imported from Caffe by bin/singa-import.sh: {net_path}"
                f"{' + ' + weights if weights else ''}"
                f"{' + ' + solverstate if solverstate else ''}\n")
        conf_path = os.path.join(out, workspace.JOB_CONF)
        write_atomic(conf_path, lambda f: f.write((head + text).encode()))
    except OSError as e:
        raise DataError(f"cannot write {e.filename or out}: {e.strerror}") from None
    finally:
        if model is not None:
            model.close()
        if state_file is not None:
            state_file.close()
    for line in dict.fromkeys(t.notes):
        print(line)
    if state is not None:
        print(DATA_POSITION_NOTE)
    if test_only:
        print(f"test-only net: job.conf has train_steps 0 and tests {job.test_steps} batches; "
              f"run bin/singa-run.sh -conf {conf_path} -test")
    elif solver_msg is None:
        print("no solver: job.conf has no updater and train_steps 0; add them to train "
              "(or import with -solver)")
    print(f"wrote {conf_path}" + (f" and {job.checkpoint_path[0]}" if model else ""))
    return conf_path


def _as_solver(path):
    """The SolverParameter of `path` where it is a solver naming its net, else None."""
    try:
        msg = netdef.read_text(path, caffe_pb2.SolverParameter())
    except ConfigError:
        return None
    named = msg.net or msg.train_net or msg.HasField("net_param") or \
        msg.HasField("train_net_param")
    return msg if named else None


def _net_of(net, solver, solver_path):
    """(NetParameter, path) of NET, or of the solver's net when NET is the solver."""
    if net is not None:
        return netdef.read_net(net), net
    for field in ("net_param", "train_net_param"):
        if solver.HasField(field):
            return netdef.upgrade(getattr(solver, field), solver_path), solver_path
    name = solver.net or solver.train_net
    if solver.test_net:
        raise ConfigError(f"{solver_path}: separate test_net files are not supported; use one "
                          f"net with TRAIN and TEST phases")
    path = netdef.relative_to(solver_path, name)
    if not os.path.exists(path) and os.path.exists(name):
        path = name
    return netdef.read_net(path), path


def _job(net, t, out, solver, solver_path):
    job = job_pb2.JobProto(name=net.name or "caffe")
    job.train_one_batch.alg = job_pb2.kBP
    job.neuralnet.layer.extend(t.layers)
    job.cluster.workspace = out
    if solver is not None:
        job_fields(job, solver, solver_path)
    else:
        job.train_steps = 0
    if netdef.TRAIN not in t.phases:       # what `caffe test` runs: test_iter, else its default
        job.train_steps, job.test_freq = 0, 0
        job.test_steps = solver.test_iter[0] if solver is not None and solver.test_iter \
            else CAFFE_TEST_ITERATIONS
    elif netdef.TEST not in t.phases:
        job.test_steps, job.test_freq = 0, 0
    return job


def _write_checkpoint(path, params, blobs, step, snap):
    """Our snapshot file (crash-safe, checksummed, with .meta): values viewed in the mapped
    weights, written as they are (float32, row-major, SINGA's shapes); the params of layers
    the weights lack are left out (the job initialises them)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_file(path, [(p.stored, (p.values if p.blob is None else
                                  blobs[p.layer][p.blob].values).reshape(p.shape), step)
                      for p in params if p.blob is None or p.layer in blobs], snap)


if __name__ == "__main__":
    sys.exit(main())
