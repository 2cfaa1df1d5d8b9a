"""SINGA's rules for job.conf / singa.conf: validated protos, errors as `file:line: what`
(the text and its lines: `singa.job.textproto`).

`load_job` mirrors what SINGA 0.3 rejects (parse errors, unknown fields and enum values, missing
required fields, `include` mixed with `exclude`, unknown srclayers, repeated layer/param names,
unknown `share_from`, an unset `alg`/updater) and adds checks SINGA only fails on later (cycles,
unregistered layer types, missing data files, missing workspace), sizes below their minimum
(`_MINIMUM`), non-finite floats, job names that cannot name a file, and a workspace that cannot
be written. NetProto's `unroll_len` /
`partition_dim` defaults reach the layers in `singa.net.neuralnet.filter_phase`, as in SINGA.
"""
import math
import os
import re

from google.protobuf import descriptor as _descriptor

from singa import device, extensions, resolve
from singa.errors import ConfigError
from singa.job import topology
from singa.job.textproto import TextConf, read_text
from singa.layers import kernels
from singa.net import graph
from singa.net.phase import in_phase
from singa.proto import job_pb2, singa_pb2

#: Phases whose nets a training run builds: kTrain always, kVal / kTest when their steps are
#: > 0 (`-test` builds only kTest: `_run_phases`).
_PHASES = (("kTrain", job_pb2.kTrain, None), ("kVal", job_pb2.kVal, "validate_steps"),
          ("kTest", job_pb2.kTest, "test_steps"))
_OUTPUT_TYPES = (job_pb2.kCSVOutput, job_pb2.kRecordOutput)
#: The job name names the log file `<job id>-<name>.log`: with a job id of up to 20 digits the
#: file name stays within the 255 bytes a file system allows.
MAX_JOB_NAME_BYTES = 230

#: Smallest value of fields that are sizes, counts, frequencies or spreads (message -> field ->
#: minimum); checked where set, for every element of a repeated field. SINGA fails later or
#: hangs on these (a zero stride divides by zero, `num_output: 0` leaves a param empty).
_MINIMUM = {
    "JobProto": dict.fromkeys(
        ("train_steps", "test_steps", "validate_steps", "disp_freq", "test_freq",
         "validate_freq", "checkpoint_freq", "warmup_steps", "checkpoint_after", "disp_after",
         "test_after", "validate_after", "step", "checkpoint_keep_newest"), 0),
    "ClusterProto": dict.fromkeys(
        ("nworker_groups", "nserver_groups", "nworkers_per_group", "nservers_per_group",
         "nworkers_per_procs", "nservers_per_procs", "sync_freq", "poll_time"), 1),
    "NetProto": {"unroll_len": 1},
    "LayerProto": {"unroll_len": 1},
    "CDProto": {"cd_k": 1},
    "StoreProto": {"batchsize": 1, "shape": 1, "random_skip": 0},
    "CharRNNProto": {"unroll_len": 1, "batchsize": 1},
    "DataProto": {"batchsize": 1, "random_skip": 0},
    "ConvolutionProto": dict(dict.fromkeys(("num_filters", "kernel", "kernel_x", "kernel_y",
                                            "stride", "stride_x", "stride_y", "group"), 1),
                             pad=0, pad_x=0, pad_y=0),
    "PoolingProto": dict(dict.fromkeys(("kernel", "kernel_x", "kernel_y", "stride", "stride_x",
                                        "stride_y"), 1), pad_x=0, pad_y=0),
    "InnerProductProto": {"num_output": 1},
    "RBMProto": {"hdim": 1},
    "GRUProto": {"dim_hidden": 1},
    "LRNProto": {"local_size": 1},
    "EmbeddingProto": {"vocab_size": 1, "feature_dim": 1},
    "OnehotProto": {"vocab_size": 1},
    "ParamGenProto": {"std": 0},        # a float field: a Gaussian's spread
    "SoftmaxLossProto": {"topk": 1},
    "ArgSortProto": {"topk": 1},
    "SplitProto": {"num_splits": 1},
    "SliceProto": {"num_slices": 1},
    "ConcateProto": {"num_concates": 1},
    "SoftmaxProto": {"num_softmax_per_instance": 1},
    "DummyProto": {"shape": 1},
    "RNNDummyProto": {"shape": 1},
    "StepProto": {"change_freq": 1},
    "LinearProto": {"change_freq": 1},
    "ExponentialProto": {"change_freq": 1},
    "FixedStepProto": {"step": 0},
}
_FLOATS = (_descriptor.FieldDescriptor.TYPE_FLOAT, _descriptor.FieldDescriptor.TYPE_DOUBLE)


def parse_monitor(name):
    """(phase, metric) of a `checkpoint_keep_best` value "[test/|validation/]<metric>": the
    phase is "test" when none is given; both lower-cased."""
    phase, sep, metric = name.rpartition("/")
    return (phase.lower() if sep else "test"), metric.lower()


def load_job(path, check_paths=True, check_layers=True, user_proto=(), user_layers=(),
             test=False, host_rank=0):
    """Parse and validate the job conf at `path` (relative to the SINGA home if relative)."""
    return parse_job(read_text(path), path, check_paths=check_paths, check_layers=check_layers,
                     user_proto=user_proto, user_layers=user_layers, test=test,
                     host_rank=host_rank)


def parse_job(text, path="<string>", check_paths=True, check_layers=True, user_proto=(),
              user_layers=(), test=False, host_rank=0):
    """Parse and validate job conf `text`; `path` only names the file in error messages.

    check_paths: data files must exist, and the GPUs `gpu` names as the process of
    `host_rank` on its host takes them (`device.of_process`; CuPy installed). The job keeps
    the conf's ids. The workspace is made by the job (`singa.job.workspace`), not here.
    check_layers: every layer type must be registered in `singa.layers`.
    user_proto, user_layers: files loaded (`singa.extensions`) besides the conf's own
    `user_proto` / `user_layers`, before the conf is parsed for good.
    test: the conf is for `-test`, which builds only the kTest net (SINGA's Driver::Test): only
    that net and its data files are checked and no updater is needed, so a conf made for
    testing alone (its data layer `include: kTest`) loads.
    """
    conf = _Conf(text, path)
    named = conf.parse(job_pb2.JobProto(), allow_unknown_extension=True)
    _load_extensions(conf, named, user_proto, user_layers)
    job = conf.parse(job_pb2.JobProto())
    _check_name(conf, job)
    _check_job(conf, job, check_layers, test)
    if check_paths:
        _check_paths(conf, job, test)
        _check_gpus_here(conf, job, host_rank)
    return job


def check_host_gpus(path, job, procs, host):
    """ConfigError at the `gpu` line of the conf at `path` (read again for its lines) unless
    this machine has the GPUs that `procs` processes of `job` on it take (host ranks 0 to
    procs - 1): `singa -check` of the processes the hostfile puts on `host`, a name of it."""
    conf = _Conf(read_text(path), path)
    conf.parse(job_pb2.JobProto(), allow_unknown_extension=True)
    _check_gpus_here(conf, job, procs - 1, f"for the {procs} processes the hostfile puts on "
                                           f"{host}")


def load_plain(path):
    """The job conf at `path` (relative to the SINGA home if relative) without the user's
    extensions, whose fields are skipped (parse_job's first pass), its cluster's layout
    checked: what the launch scripts read of a job (its processes, steps, workspace)."""
    conf = _Conf(read_text(path), path)
    job = conf.parse(job_pb2.JobProto(), allow_unknown_extension=True)
    problem = topology.check_layout(job.cluster)
    if problem:
        conf.fail(conf.line("cluster"), problem)
    return job


def absolute_paths(job, base):
    """Make every relative file path of `job` absolute against the folder `base` (the Python
    API resolves against the current directory; the CLI against the SINGA home); store URLs
    (`memory://0`), and "latest" and "best" in checkpoint_path, stay as they are."""
    def fix(path):
        if not path or "://" in path:
            return path
        return os.path.normpath(os.path.join(base, os.path.expanduser(path)))

    for layer in job.neuralnet.layer:
        for conf, fields in ((layer.store_conf, ("path", "mean_file", "std_file", "root_folder")),
                             (layer.sharddata_conf, ("path",)), (layer.lmdbdata_conf, ("path",)),
                             (layer.char_rnn_conf, ("path", "vocab_path")),
                             (layer.rgbimage_conf, ("meanfile",))):
            for field in fields:
                if conf.HasField(field):
                    setattr(conf, field, fix(getattr(conf, field)))
    job.cluster.workspace = fix(job.cluster.workspace)
    for field in ("checkpoint_path", "user_proto", "user_layers"):
        values = [v if v in ("latest", "best") and field == "checkpoint_path" else fix(v)
                  for v in getattr(job, field)]
        del getattr(job, field)[:]
        getattr(job, field).extend(values)
    return job


def load_singa_conf(path):
    """Parse the global conf (conf/singa.conf) into a SingaProto."""
    return _Conf(read_text(path), path).parse(singa_pb2.SingaProto())


def _run_phases(job, test):
    """(name, phase) of the nets a run builds: `-test` (`test`) only kTest; training kTrain and
    the phases it tests or validates (`_PHASES`)."""
    if test:
        return [("kTest", job_pb2.kTest)]
    return [(pname, phase) for pname, phase, steps in _PHASES
            if steps is None or getattr(job, steps) > 0]


def _phase_layers(job, phase):
    """(index, LayerProto) of the layers in the `phase` net (SINGA's include/exclude rules)."""
    return [(i, layer) for i, layer in enumerate(job.neuralnet.layer) if in_phase(layer, phase)]


class _Conf(TextConf):
    """A SINGA conf: field sizes at least their `_MINIMUM`, floats finite, layers named in
    errors, SINGA's hints for extensions and stale formats."""

    def check(self, msg):
        self.check_values(msg)

    def missing(self, msg, path):
        m = re.match(r"neuralnet\.layer\[(\d+)\]", path)
        name = msg.neuralnet.layer[int(m.group(1))].name if m else ""
        return (f"layer '{name}': " if name else "") + super().missing(msg, path)

    def check_values(self, msg, prefix="", who=""):
        """Integer fields at least their `_MINIMUM`, floats finite, in `msg` and below it;
        `prefix` is msg's field path, `who` names its layer."""
        minimum = _MINIMUM.get(msg.DESCRIPTOR.name, {})
        for field, value in msg.ListFields():
            path = prefix + (f"[{field.full_name}]" if field.is_extension else field.name)
            values = value if field.is_repeated else [value]
            if field.type == _descriptor.FieldDescriptor.TYPE_MESSAGE:
                for i, sub in enumerate(values):
                    sub_path = f"{path}[{i}]." if field.is_repeated else path + "."
                    self.check_values(sub, sub_path, f"layer '{sub.name}': "
                                      if path == "neuralnet.layer" else who)
                continue
            low = minimum.get(field.name)
            shown = path.split("].", 1)[1] if who else path
            for v in values:
                if low is not None and v < low:
                    self.fail(self.line(path), f"{who}{shown} must be at least {low}, got {v}")
                if field.type in _FLOATS and not math.isfinite(v):
                    self.fail(self.line(path), f"{who}{shown} must be a finite number, got {v}")

    def layer_line(self, i):
        return self.line(f"neuralnet.layer[{i}].name", f"neuralnet.layer[{i}]")

    def parse_error(self, e):
        msg = super().parse_error(e)
        ext = re.match(r'Extension "([\w.]+)" not registered', msg)
        if ext:
            return (f"extension [{ext.group(1)}] is not defined: name the .proto file that "
                    f"defines it with user_proto in the conf or the -user_proto flag "
                    f"(docs/user-layers.md)")
        if re.search(r"^[ \t]*model[ \t]*[{<:]", self.text, re.M):
            return f"not a SINGA 0.2/0.3 job conf (stale pre-0.1 format?): {msg}"
        return msg


def _load_extensions(conf, job, user_proto, user_layers):
    """Load the .proto and layer files the conf names (relative to the SINGA home) and those given."""
    for field, paths, load in (("user_proto", user_proto, extensions.load_proto),
                               ("user_layers", user_layers, extensions.load_layers)):
        for value in getattr(job, field):
            if not os.path.isfile(resolve(value)):
                conf.fail(conf.line(field), f"{field} '{value}' does not exist (resolved to "
                                            f"{resolve(value)})")
            load(resolve(value))
        for value in paths:
            load(value)


def _check_name(conf, job):
    """The job name becomes part of a file name: no `/` or NUL, at most MAX_JOB_NAME_BYTES."""
    name = job.name
    if "/" in name or "\0" in name:
        conf.fail(conf.line("name"), f"name {name[:60]!r}: a job name may not contain '/' or "
                  f"NUL (it names the log file)")
    if len(name.encode()) > MAX_JOB_NAME_BYTES:
        conf.fail(conf.line("name"), f"name is {len(name.encode())} bytes long; a job name may "
                  f"have at most {MAX_JOB_NAME_BYTES} (it names the log file)")


def _check_job(conf, job, check_layers, test):
    alg = job.train_one_batch
    if not alg.HasField("alg") and not alg.HasField("user_alg"):
        conf.fail(conf.line("train_one_batch"),
                  "train_one_batch.alg is not set (kBP, kBPTT or kCD)")
    if not test:
        _check_runnable(conf, job)
    if job.train_steps > 0 and not test:
        up = job.updater
        if not up.HasField("type") and not up.HasField("user_type"):
            conf.fail(conf.line("updater.type", "updater"),
                      "updater.type is not set (kSGD, kAdaGrad, kRMSProp, kNesterov, ...)")
        lr = up.learning_rate
        if not lr.HasField("type") and not lr.HasField("user_type"):
            conf.fail(conf.line("updater.learning_rate", "updater"),
                      "updater.learning_rate.type is not set (kFixed, kStep, ...)")
    if not job.cluster.workspace:
        conf.fail(conf.line("cluster"), "cluster.workspace is not set")
    layers = job.neuralnet.layer
    _check_include_exclude(conf, layers)
    all_names = {layer.name for layer in layers}
    for pname, phase in _run_phases(job, test):
        _check_phase(conf, _phase_layers(job, phase), pname, all_names)
    if check_layers:
        import singa.layers  # noqa: F401  (registers the layer types)
        from singa.layers.base import unavailable
        for i, layer in enumerate(layers):
            reason = unavailable(layer)
            if reason:
                conf.fail(conf.layer_line(i), f"layer '{layer.name}': {reason}")
    _check_monitor(conf, job, check_layers)


def _check_monitor(conf, job, check_layers):
    """checkpoint_keep_best: "[test/|validation/]<metric>" of a phase that runs, a metric its
    net's layers produce (unless a user layer leaves its METRICS undeclared: then the worker
    checks at the phase's first event); its companions need it."""
    if not job.checkpoint_keep_best:
        if job.checkpoint_on_improvement:
            conf.fail(conf.line("checkpoint_on_improvement"), "checkpoint_on_improvement needs "
                      "checkpoint_keep_best, the metric it monitors (e.g. \"accuracy\")")
        return
    name = job.checkpoint_keep_best
    line = conf.line("checkpoint_keep_best")
    phase, metric = parse_monitor(name)
    if phase not in ("test", "validation"):
        conf.fail(line, f'checkpoint_keep_best "{name}": the phase must be test or validation '
                        f'("accuracy", "test/loss", "validation/accuracy")')
    field, enum = ("test_steps", job_pb2.kTest) if phase == "test" else \
        ("validate_steps", job_pb2.kVal)
    if getattr(job, field) <= 0:
        conf.fail(line, f'checkpoint_keep_best "{name}" monitors the {phase} metrics, but '
                        f'{field} is 0: no {phase} runs')
    if job.checkpoint_keep_best_k < 1:
        conf.fail(conf.line("checkpoint_keep_best_k"),
                  f"checkpoint_keep_best_k must be at least 1, got {job.checkpoint_keep_best_k}")
    produced = _metrics_of(_phase_layers(job, enum)) if check_layers else None
    if produced is not None and metric not in produced:
        conf.fail(line, f'checkpoint_keep_best "{name}": the {phase} net\'s layers produce '
                        f'{", ".join(sorted(produced)) or "no metrics"}')


def _metrics_of(layers):
    """The metric names the (index, LayerProto) `layers` produce; None if a user layer's are
    not declared."""
    from singa.layers.base import layer_class
    names = set()
    for _, layer in layers:
        declared = getattr(layer_class(layer), "METRICS", None)
        if declared is None and layer.HasField("user_type"):
            return None
        names.update(declared or ())
    return names


def _check_runnable(conf, job):
    """What this version trains: kBP, kBPTT or kCD (with RBM layers), a layout SINGA can run."""
    alg = job.train_one_batch
    at = conf.line("train_one_batch")
    if alg.user_alg or alg.alg not in (job_pb2.kBP, job_pb2.kBPTT, job_pb2.kCD):
        name = alg.user_alg or job_pb2.AlgType.Name(alg.alg)
        conf.fail(at, f"train_one_batch: alg {name} is not implemented yet (kBP, kBPTT and kCD "
                      f"are)")
    if alg.alg == job_pb2.kCD and not any(layer.type == job_pb2.kRBMVis
                                          for layer in job.neuralnet.layer):
        conf.fail(at, "train_one_batch: alg kCD trains RBM layers (kRBMVis, kRBMHid) and the "
                      "net has none")
    cl = job.cluster
    at = conf.line("cluster")
    problem = topology.check_layout(cl)
    if problem:
        conf.fail(at, problem)
    if min(cl.nworker_groups, cl.nserver_groups, cl.nworkers_per_group,
           cl.nservers_per_group) < 1:
        conf.fail(at, "cluster: nworker_groups, nserver_groups, nworkers_per_group and "
                      "nservers_per_group must be at least 1")
    if cl.nworker_groups % cl.nserver_groups:
        conf.fail(at, f"cluster: nworker_groups {cl.nworker_groups} is not a multiple of "
                      f"nserver_groups {cl.nserver_groups} (each server group serves as many "
                      f"worker groups)")
    if cl.nworker_groups > 1 and not cl.share_memory and topology.nprocs(cl) == 1:
        conf.fail(at, "cluster: several worker groups in one process need share_memory: true")


def _check_gpus_here(conf, job, host_rank=0, whose=None):
    """The GPUs `gpu` names, as the process of `host_rank` on this host takes them
    (`device.of_process`), are visible here, through an installed CuPy; `whose` says whose
    they are in the error (that process's by default)."""
    what = "gpu"
    if host_rank and job.gpu:
        what = (f"gpu: {list(job.gpu)} {whose or f'at host rank {host_rank}'} (host rank r "
                f"takes each id + r × {max(job.gpu) + 1})")
    ids = device.of_process(job.gpu, host_rank)
    try:
        device.check(ids, what)
    except ConfigError as e:
        conf.fail(conf.line("gpu", "gpu[0]"), f"{e}; or delete the gpu lines to train on the CPU")
    if not ids:
        return
    try:
        kernels.check_gpu_engine()
    except ConfigError as e:
        conf.fail(conf.line("gpu", "gpu[0]"), str(e))
    if job.gpu_tf32:
        old = [(i, cc) for i in ids for cc in [device.compute_capability(i)] if cc < (8, 0)]
        if old:
            i, cc = old[0]
            conf.fail(conf.line("gpu_tf32"), f"gpu_tf32: true, but GPU {i} (compute capability "
                                             f"{cc[0]}.{cc[1]}) has no TF32 tensor cores (8.0 "
                                             f"and later have); delete the line")


def _check_include_exclude(conf, layers):
    first = {}
    for i, layer in enumerate(layers):
        for kind in ("include", "exclude"):
            if getattr(layer, kind):
                first.setdefault(kind, i)
    if len(first) == 2:
        i = max(first.values())
        conf.fail(conf.layer_line(i), f"layer '{layers[i].name}': don't use include and exclude "
                  f"together (line {conf.layer_line(min(first.values()))} uses the other)")


def _check_phase(conf, members, pname, all_names):
    layers = [layer for _, layer in members]
    graph.sort(layers, pname, all_names, conf.path, lambda k, field: conf.line(
        f"neuralnet.layer[{members[k][0]}].{field}", f"neuralnet.layer[{members[k][0]}]"))
    params = {}
    for i, layer in members:
        for j, p in enumerate(layer.param):
            line = conf.line(f"neuralnet.layer[{i}].param[{j}].name", f"neuralnet.layer[{i}].param[{j}]")
            if p.name in params:
                what = f"param name '{p.name}'" if p.name else "unnamed param (every param needs a name)"
                conf.fail(line, f"layer '{layer.name}': duplicate {what} in the {pname} net "
                          f"(also at line {params[p.name]})")
            params[p.name] = line
    for i, layer in members:
        for j, p in enumerate(layer.param):
            if p.share_from and p.share_from not in params:
                conf.fail(conf.line(f"neuralnet.layer[{i}].param[{j}].share_from"),
                          f"layer '{layer.name}': share_from '{p.share_from}' names no param "
                          f"of the {pname} net")


def _check_paths(conf, job, test):
    for _, phase in _run_phases(job, test):
        for i, layer in _phase_layers(job, phase):
            prefix = f"neuralnet.layer[{i}]"
            files = []
            if layer.HasField("store_conf") and layer.type not in _OUTPUT_TYPES:
                files += [("store_conf." + f, getattr(layer.store_conf, f))
                          for f in ("path", "mean_file", "std_file")]
            for field in ("sharddata_conf", "lmdbdata_conf"):
                if layer.HasField(field):
                    files.append((field + ".path", getattr(layer, field).path))
            if layer.HasField("char_rnn_conf"):
                files += [("char_rnn_conf." + f, getattr(layer.char_rnn_conf, f))
                          for f in ("path", "vocab_path")]
            for field, value in files:
                if value and "://" not in value and not os.path.exists(resolve(value)):
                    conf.fail(conf.line(f"{prefix}.{field}", prefix),
                              f"layer '{layer.name}': {field} '{value}' does not exist "
                              f"(resolved to {resolve(value)})")
    ws = resolve(job.cluster.workspace)
    made = ws if os.path.isdir(ws) else os.path.dirname(ws)    # the job makes it (workspace)
    if not os.path.isdir(made):
        conf.fail(conf.line("cluster.workspace"), f"cluster.workspace '{job.cluster.workspace}'"
                  f" does not exist and neither does its parent ({made})")
    why = _unwritable(made)
    if why:
        conf.fail(conf.line("cluster.workspace"),
                  f"cluster.workspace: cannot {'write to' if made == ws else 'create'} {ws}: "
                  f"{why}")


def _unwritable(folder):
    """Why files cannot be created in `folder`, or None."""
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        return "read-only file system"
    if not os.access(folder, os.W_OK | os.X_OK):
        return "permission denied"
    return None


