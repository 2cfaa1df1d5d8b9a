"""A model written out: its job as a conf that `singa-run.sh -conf` runs (`Model.to_conf`), and
the folder `Model.save` writes and `load_model` reads: `job.conf` (the model's job, its input
layers' preprocessing kept: numpy inputs as layers without data, mean and std files copied
beside it) and the params of its last fit (the final snapshot's files)."""
import os
import shutil

from google.protobuf import text_format

from singa import checkpoint, files
from singa.api.session import with_kvfiles
from singa.errors import ConfigError
from singa.proto import job_pb2

#: the store path of a saved model's numpy input: it reads the data given to evaluate or fit
SAVED_INPUT = 'memory://saved-model-input'


def conf_text(job, path=None):
    """The text of `job` (its paths absolute); with `path`, also written there (whole or not
    at all), its numpy data as kvfiles beside it (`<conf name>-<layer>-<phases>.bin`); without,
    numpy data are an error: they live in this process only."""
    numpy_data = [ly.name for ly in job.neuralnet.layer if ly.store_conf.backend == 'memory']
    if numpy_data and path is None:
        raise ConfigError(f"to_conf: layer '{numpy_data[0]}' reads numpy data, which live in "
                          f"this process: give a path, to_conf('job.conf'), to write them "
                          f"as kvfiles beside the conf")
    if path is None:
        return text_format.MessageToString(job)
    path = os.path.abspath(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    text = text_format.MessageToString(with_kvfiles(job, os.path.dirname(path), stem + '-'))
    try:
        files.write_atomic(path, lambda f: f.write(text.encode()))
    except OSError as e:
        raise ConfigError(f"to_conf: cannot write {path}: {e.strerror}") from None
    return text


def save(path, job, params):
    """Write the folder `path` (made if missing): `job` (its paths absolute) as `job.conf`,
    its `checkpoint_path` the copies of the snapshot whose worker 0's file is `params`. What
    an earlier save left there is replaced only once the new model is whole: the files are
    copied into a staging folder inside `path` first (a full disk leaves the earlier model as
    it was, and a new `path` not made at all), moved in, `job.conf` last, then the earlier
    model's other files removed; what else the folder holds is left alone."""
    path = os.path.abspath(path)
    made = not os.path.isdir(path)
    stage = os.path.join(path, f".saving{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        shutil.rmtree(stage, ignore_errors=True)
        os.mkdir(stage)
        del job.checkpoint_path[:]
        for src in checkpoint.files_of(params):
            for f in (src, checkpoint.meta_path(src)):
                if os.path.exists(f):
                    files.copy_atomic(f, os.path.join(stage, os.path.basename(f)))
            job.checkpoint_path.append(os.path.join(path, os.path.basename(src)))
        for ly in job.neuralnet.layer:
            sc = ly.store_conf
            if sc.backend == 'memory':
                sc.path = SAVED_INPUT
            for field in ('mean_file', 'std_file'):
                if sc.HasField(field):
                    name = f"{ly.name}-{field[:-5]}.bin"
                    files.copy_atomic(getattr(sc, field), os.path.join(stage, name))
                    setattr(sc, field, os.path.join(path, name))
        text = text_format.MessageToString(job)
        files.write_atomic(os.path.join(stage, 'job.conf'), lambda f: f.write(text.encode()))
        earlier = _model_files(path)
        new = sorted(os.listdir(stage), key=lambda f: f == 'job.conf')     # job.conf last
        for f in new:
            os.replace(os.path.join(stage, f), os.path.join(path, f))
        files.fsync_dir(path)
        for f in earlier - set(new):
            os.unlink(os.path.join(path, f))
        os.rmdir(stage)
    except OSError as e:
        shutil.rmtree(stage, ignore_errors=True)
        if made:
            shutil.rmtree(path, ignore_errors=True)
        kept = "" if made else " (what the folder held is kept)"
        raise ConfigError(f"save: cannot write {e.filename or path}: {e.strerror}{kept}") \
            from None


def _model_files(path):
    """The files of a model `save` wrote in the folder `path`: job.conf, the snapshot's files
    and the copied mean and std files its job.conf names."""
    out = {f for f in os.listdir(path) if f == 'job.conf'
           or checkpoint.parse_step_worker(f.removesuffix(checkpoint.META_SUFFIX))}
    try:
        with open(os.path.join(path, 'job.conf')) as f:
            job = text_format.Parse(f.read(), job_pb2.JobProto())
    except (OSError, UnicodeDecodeError, text_format.ParseError):
        return out
    return out | {os.path.basename(p) for ly in job.neuralnet.layer
                  for p in (ly.store_conf.mean_file, ly.store_conf.std_file)
                  if p and os.path.dirname(p) == path and os.path.isfile(p)}


def load(path):
    """(the conf, the param files in worker order) of the folder `save` wrote."""
    conf = os.path.join(path, 'job.conf')
    if not os.path.isfile(conf):
        raise ConfigError(f"load_model: {conf}: no such file (a folder Model.save wrote)")
    params = sorted((checkpoint.parse_step_worker(f)[1], os.path.join(os.path.abspath(path), f))
                    for f in os.listdir(path) if checkpoint.parse_step_worker(f)
                    and f.endswith(checkpoint.SUFFIX))
    if not params:
        raise ConfigError(f"load_model: {path} holds no params (step<N>-worker<W>.bin)")
    return conf, [f for _, f in params]
