"""SINGA 0.3's Keras-like Python API (tool/python/singa/model.py): build a JobProto from
layers, then train, test and predict through `singa.session`.

    m = Sequential('mlp')
    m.add(Dense(2500, init='uniform', activation='tanh')) ...
    m.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.001), cluster=Cluster(ws))
    h = m.fit(X_train, nb_epoch=100)             # a History
    m.evaluate(X_test, test_steps=10)            # {'loss': ..., 'accuracy': ...}
    m.predict(x)                                 # probabilities, per sample

`from singa.model import *` gives the layers (`singa.layer`), `Parameter` and the names below,
as SINGA's did. Relative paths resolve against the current directory. Unlike SINGA's: `fit`
trains (and with `with_test=True` tests as it goes), keeps a `checkpoint_freq` it is given,
and returns metrics as floats; `evaluate` tests the params `fit` left (or `checkpoint_path`).
"""
import copy
import os

import numpy as np
from google.protobuf import text_format

from singa import checkpoint, config, naming, session
from singa.errors import ConfigError
from singa.io import memory
from singa.layer import *  # noqa: F401,F403  (SINGA's `from singa.model import *` gives them)
from singa.layer import (Accuracy, Data, Dense, Layer, LayerUpdater, Loss, enumAlgType,
                        generate_name, load_model_parameter, save_model_parameter, setval)
from singa.metrics import History
from singa.parameter import Parameter
from singa.proto import job_pb2

__all__ = ["Model", "Sequential", "Energy", "Store", "Algorithm", "Updater", "SGD", "AdaGrad",
           "Cluster", "History", "Parameter", "load_model_parameter", "save_model_parameter"]
__all__ += [name for name in dir() if name[:1].isupper() and name not in __all__
            and isinstance(globals()[name], type) and globals()[name].__module__ == "singa.layer"]

kTrain, kVal, kTest = job_pb2.kTrain, job_pb2.kVal, job_pb2.kTest


class Model:
    """A job being built: `add` layers, `compile`, then `fit` / `evaluate` / `predict`.

    `jobconf` is the JobProto; `last_checkpoint_path` the newest snapshot `fit` wrote (worker
    0's file, `<workspace>/checkpoint/step<N>-worker0.bin`).
    """

    #: the training algorithm when fit is given none
    default_alg = 'bp'

    def __init__(self, name='my model', argv=None, label=False):
        self.jobconf = job_pb2.JobProto(name=name)
        self.jobconf.train_one_batch.alg = enumAlgType(self.default_alg)
        self.layers = []
        self.label = label
        self.argv = argv
        self.result = None
        self.last_checkpoint_path = None
        self.cudnn = False
        self.accuracy = False
        self.conf_net = None      # the NetProto of a model loaded by from_conf
        naming.reset_names()      # its generated names depend on its own layers only

    # --- building ---------------------------------------------------------------------------
    def add(self, layer):
        """Append `layer`; a Data layer whose name was generated is added as a copy named where
        it joins (`data<n>`, the model's counter), as SINGA's helper named it in a fresh
        process, wherever the script made it: its reader position resumes by that name."""
        if getattr(layer, 'generated_name', False):
            layer = _copy_data(layer)
            layer.layer.name = generate_name('data')
        self.layers.append(layer)

    def exist_datalayer(self, phase):
        return any(_phase(phase) in ly.layer.include for ly in self.layers if ly.is_datalayer)

    def compile(self, optimizer=None, cluster=None, loss=None, topk=1, **kwargs):
        """Set the updater (`optimizer`, e.g. SGD) and `cluster` (a Cluster with the workspace);
        `loss` 'categorical_crossentropy' turns a last softmax into kSoftmaxLoss (or adds one),
        'mean_squared_error' into kEuclideanLoss."""
        if optimizer is None:
            raise ConfigError("compile: optimizer (an Updater such as SGD) is required")
        if cluster is None:
            raise ConfigError("compile: cluster (a Cluster with a workspace) is required")
        self.jobconf.updater.CopyFrom(optimizer.proto)
        self.jobconf.cluster.CopyFrom(cluster.proto)
        if loss is None:
            return
        if loss not in ('categorical_crossentropy', 'mean_squared_error'):
            raise ConfigError(f"compile: loss {loss!r} is not known ('categorical_crossentropy' "
                              f"or 'mean_squared_error')")
        if not self.layers:
            raise ConfigError("compile: add layers before compiling")
        last = self.layers[-1]
        ly = last.mask if getattr(last, 'mask', None) is not None else last.layer
        if ly.type == job_pb2.kSoftmax:
            if loss == 'categorical_crossentropy':
                ly.type = job_pb2.kSoftmaxLoss
                ly.softmaxloss_conf.topk = topk
            else:
                ly.type = job_pb2.kEuclideanLoss
        elif loss == 'categorical_crossentropy':
            self.add(Loss('softmaxloss', topk=topk))
        else:
            self.add(Loss('euclideanloss'))

    def build(self):
        """The NetProto: layers chained in order (data layers are sources only), each
        activation `mask` after its layer, the first data layer also the last layer's label
        source (SINGA's Model.build)."""
        if self.conf_net is not None:
            net = job_pb2.NetProto()
            net.CopyFrom(self.conf_net)
            self.jobconf.neuralnet.CopyFrom(net)
            return net
        if not self.layers:
            raise ConfigError(f"model '{self.jobconf.name}' has no layers")
        net = job_pb2.NetProto()
        src = self.layers[0].layer.name
        last = None
        for item in self.layers:
            ly = net.layer.add()
            ly.CopyFrom(item.layer)
            last = ly
            if item.is_datalayer:
                continue
            ly.srclayers.append(src)
            src = ly.name
            if getattr(item, 'mask', None) is not None:
                mly = net.layer.add()
                mly.CopyFrom(item.mask)
                mly.srclayers.append(src)
                src = mly.name
                last = mly
            if getattr(item, 'bidirect', None) is not None:
                bly = net.layer.add()
                bly.CopyFrom(item.bidirect)
                bly.srclayers.append(src)
        if self.label:
            label = net.layer.add()
            label.CopyFrom(Layer(name='label', type=job_pb2.kLabel).layer)
            label.srclayers.append(self.layers[0].layer.name)
            last.srclayers.append(label.name)
        elif last.type == job_pb2.kRBMVis:
            last.srclayers.append(bly.name)
        else:
            last.srclayers.append(self.layers[0].layer.name)
        if self.accuracy:
            top = self.layers[-1].layer.name
            sm = net.layer.add()
            sm.CopyFrom(Layer(name='softmax', type=job_pb2.kSoftmax).layer)
            sm.include.append(kTest)
            sm.srclayers.append(top)
            acc = net.layer.add()
            acc.CopyFrom(Accuracy().layer)
            acc.include.append(kTest)
            acc.srclayers.extend(['softmax', self.layers[0].layer.name])
        self.jobconf.neuralnet.CopyFrom(net)
        return net

    def to_conf(self):
        """The text JobProto of the model: what `singa-run.sh -conf` would run."""
        self.build()
        return text_format.MessageToString(self.jobconf)

    @classmethod
    def from_conf(cls, path, user_proto=(), user_layers=()):
        """A model of the job conf at `path` (relative to the current directory): `fit` trains
        it as `singa-run.sh -conf` would, `evaluate` and `predict` use its nets. `user_proto`
        and `user_layers` (files, as singa-run.sh's flags) join the conf's own extensions."""
        extra = {field: [os.path.abspath(p) for p in _list(paths)]
                 for field, paths in (('user_proto', user_proto), ('user_layers', user_layers))}
        job = config.load_job(os.path.abspath(path), check_paths=False, **extra)
        for field, paths in extra.items():
            getattr(job, field).extend(paths)
        m = cls(job.name)
        m.jobconf = job
        m.conf_net = job.neuralnet
        return m

    def display(self):
        """Print the JobProto as text."""
        print(text_format.MessageToString(self.jobconf))

    # --- running ------------------------------------------------------------------------------
    def fit(self, data_or_x=None, y=None, nb_epoch=0, batch_size=None, with_test=False,
            test_steps=None, test_freq=None, disp_freq=None, checkpoint_freq=None,
            resume=False, *, alg=None, test_data=None, validate_data=None, verbose=False,
            progress=True, execpath='', device=None, **fields):
        """Train for `nb_epoch` steps (SINGA's meaning: train steps, not passes over the
        data) on `data_or_x`: a Data layer, numpy samples with labels `y`, or (x, y) (SINGA's
        keyword `data=` too). Returns a History.

        `batch_size`: of numpy samples (default 64), else the new batch size of the train
        data layer. `with_test`: also test during training, every `test_freq` steps (default
        nb_epoch/10) on `test_steps` batches (default 10) of `test_data` (a Data layer, or
        numpy (x, y)) or the model's test data layer; with no test data it means what SINGA's
        meant, test later (`evaluate`), and fit only trains. `validate_data` likewise
        validates (`validate_freq`, `validate_steps`). `disp_freq`: train metrics every so
        many steps (default nb_epoch/10); `checkpoint_freq`: a snapshot every so many steps
        (one is written at the end in any case). `resume`: continue from the newest complete
        snapshot in the workspace (bit-exact; nb_epoch is the step to reach); a snapshot that
        lacks the net's params is an error, not a fresh start. `alg`: 'bp' (default), 'bptt'
        or 'cd'. Other keywords set JobProto fields (`seed`, `checkpoint_path`, ...).
        `verbose` logs SINGA's lines to stderr; `progress` shows a progress bar. A model loaded
        by `from_conf` trains as its conf says (nb_epoch 0: its train_steps; its tests) unless
        told otherwise.
        """
        if execpath or device is not None:
            raise ConfigError("fit: execpath and device (GPUs) are not supported; the job runs "
                              "on the CPU")
        if 'data' in fields:        # SINGA's name of the first argument
            if data_or_x is not None:
                raise ConfigError("fit: give the data once (data_or_x or data=)")
            data_or_x = fields.pop('data')
        for key, value in (('test_steps', test_steps), ('test_freq', test_freq),
                           ('disp_freq', disp_freq), ('checkpoint_freq', checkpoint_freq)):
            if value is not None:
                fields[key] = value
        from_conf = self.conf_net is not None
        if not isinstance(nb_epoch, (int, np.integer)) or nb_epoch < 0 \
                or (nb_epoch == 0 and not from_conf):
            raise ConfigError(f"fit: nb_epoch (the number of training steps) must be a "
                              f"positive int, got {nb_epoch!r}")
        job = self._job(fields)
        if data_or_x is not None or not (from_conf or self.exist_datalayer('train')):
            self._put_data(_as_data(data_or_x, y, kTrain, batch_size, 'fit'), kTrain)
        elif batch_size is not None:
            self._set_batchsize(kTrain, batch_size)
        for key, data, phase in (('validate_data', validate_data, kVal),
                                 ('test_data', test_data, kTest)):
            if data is not None:
                self._put_data(_as_data(data, None, phase, batch_size, 'fit: ' + key), phase)
        job.neuralnet.CopyFrom(self.build())
        if nb_epoch:
            job.train_steps = int(nb_epoch)
        every = max(1, job.train_steps // 10)
        if not from_conf and 'disp_freq' not in fields:
            job.disp_freq = every
        if validate_data is not None:
            job.validate_freq = fields.get('validate_freq', every)
            job.validate_steps = fields.get('validate_steps', 10)
        has_test = any(_in_phase(ly, kTest) and ly.type in session.STORE_INPUTS
                       for ly in job.neuralnet.layer)
        if with_test and has_test:
            job.test_steps = fields.get('test_steps', job.test_steps or 10)
            job.test_freq = fields.get('test_freq', job.test_freq or every)
        elif not from_conf:
            job.test_steps = 0
        for item in self.layers:
            if item.is_datalayer and getattr(item, 'checkpoint', None) \
                    and 'checkpoint_path' not in fields:
                job.checkpoint_path.extend(_list(item.checkpoint))
        if alg is not None:
            job.train_one_batch.alg = enumAlgType(alg)
        history = session.train(session.prepare(job), resume, verbose, progress)
        if history.snapshots:
            self.last_checkpoint_path = history.snapshots[-1][1]
        self.result = history
        return history

    def evaluate(self, data=None, y=None, alg=None, checkpoint_path=None, execpath='',
                 device=None, show_acc=False, batch_size=None, verbose=False, **fields):
        """Test on `test_steps` batches (default 10) of `data` (a Data layer or numpy samples
        with labels `y`) with the params of `checkpoint_path` (files, "latest" or "best"),
        by default the newest snapshot `fit` wrote; returns {metric: value}."""
        if execpath or device is not None:
            raise ConfigError("evaluate: execpath and device (GPUs) are not supported")
        job = self._job(fields)
        if data is not None:
            self._put_data(_as_data(data, y, kTest, batch_size, 'evaluate'), kTest)
        elif batch_size is not None:
            self._set_batchsize(kTest, batch_size)
        self.accuracy = show_acc
        job.neuralnet.CopyFrom(_net_of(self.build(), kTest))
        job.test_steps = fields.get('test_steps', job.test_steps if self.conf_net else 10) or 10
        job.train_steps = 0
        if alg is not None:
            job.train_one_batch.alg = enumAlgType(alg)
        del job.checkpoint_path[:]
        job.checkpoint_path.extend(self._params_from(checkpoint_path, 'evaluate'))
        metrics = session.test(session.prepare(job), verbose)
        self.result = metrics
        return metrics

    def predict(self, x, checkpoint_path=None):
        """The net's outputs for the numpy samples `x` (probabilities for a softmax net), with
        the params `fit` left or those of `checkpoint_path`; `x` gets the preprocessing of the
        model's (test, else train) data layer, and is fed as it is when the model has none."""
        job = self._job({})
        if self.conf_net is None and not any(item.is_datalayer for item in self.layers):
            # the input layer of x's samples (predict feeds them in batches of its own)
            x = np.asarray(x)
            self.layers.insert(0, Data(x=x[:1], phase='test', batch_size=1))
            try:
                net = self.build()
            finally:
                memory.release(self.layers.pop(0).layer.store_conf.path)
        else:
            net = self.build()
        data = [ly for ly in net.layer if ly.type in session.STORE_INPUTS]
        if not data:
            raise ConfigError("predict: the model's net has no input layer reading a store")
        tested = any(_in_phase(ly, kTest) for ly in data)
        job.neuralnet.CopyFrom(_net_of(net, kTest if tested else kTrain))
        job.train_steps, job.test_steps, job.validate_steps = 0, 0, 0
        del job.checkpoint_path[:]
        job.checkpoint_path.extend(self._params_from(checkpoint_path, 'predict'))
        return session.predict(session.prepare(job), x)

    # --- helpers ------------------------------------------------------------------------------
    def _job(self, fields):
        """A copy of jobconf with JobProto `fields` set (ConfigError naming an unknown one)."""
        job = job_pb2.JobProto()
        job.CopyFrom(self.jobconf)
        if not job.cluster.workspace:
            raise ConfigError("compile the model with a Cluster (its workspace) first")
        for key, value in fields.items():
            if key not in job_pb2.JobProto.DESCRIPTOR.fields_by_name:
                raise ConfigError(f"unknown keyword {key!r} (not a JobProto field)")
            job.ClearField(key)
            setval(job, **{key: value})
        return job

    def _put_data(self, data, phase):
        """Make `data` (a Data layer of `phase` only, ours to change) the model's data layer of
        `phase`, first (as SINGA inserts it), replacing those it had, and named as its data
        layers of the other phases: a net's layers read one input name whatever the phase."""
        if self.conf_net is not None:
            raise ConfigError("a model loaded from a conf reads the data its conf names; give "
                              "fit/evaluate no data (or change the conf)")
        self.layers = [ly for ly in self.layers
                       if not (ly.is_datalayer and _in_phase(ly.layer, phase))]
        others = [ly for ly in self.layers if ly.is_datalayer]
        if others:
            data.layer.name = others[0].layer.name
        elif getattr(data, 'generated_name', False):
            data.layer.name = 'data0'   # as made first, before any layer: SINGA's scripts' name
        self.layers.insert(0, data)

    def _set_batchsize(self, phase, batch_size):
        """Set the batch size of the model's data layers of `phase`."""
        layers = self.conf_net.layer if self.conf_net is not None else \
            [item.layer for item in self.layers if item.is_datalayer]
        for ly in layers:
            if ly.type in session.STORE_INPUTS and _in_phase(ly, phase):
                del ly.store_conf.batchsize[:]
                ly.store_conf.batchsize.append(batch_size)

    def _params_from(self, checkpoint_path, what):
        if checkpoint_path is not None:
            return _list(checkpoint_path)
        if self.last_checkpoint_path is None:
            raise ConfigError(f"{what}: no params: fit the model first or give checkpoint_path")
        folder, name = os.path.split(self.last_checkpoint_path)
        step = checkpoint.parse_step_worker(name)[0]
        snaps = [s for s in checkpoint.list_snapshots(folder) if s.step == step]
        return [snaps[0].files[w] for w in sorted(snaps[0].files)] if snaps \
            else [self.last_checkpoint_path]


class Energy(Model):
    """An energy model: `add(RBM(out_dim))` expands into a sigmoid Dense stack (params loaded
    from the previous RBMs' checkpoints) under RBMVis/RBMHid (SINGA's Energy.add); it trains
    with contrastive divergence (kCD) unless fit is given another `alg`."""
    default_alg = 'cd'

    def __init__(self, name='my model', argv=None, label=False):
        super().__init__(name=name, argv=argv, label=label)

    def add(self, layer):
        if getattr(layer, 'layer_type', None) == job_pb2.kRBMVis:
            for i in range(1, len(layer.out_dim)):
                parw = Parameter(name='w', init='none', level=i)
                parb = Parameter(name='b', init='none', level=i)
                self.layers.append(Dense(layer.out_dim[i - 1], w_param=parw, b_param=parb,
                                         activation='sigmoid'))
        super().add(layer)


class Sequential(Model):
    """Layers in a chain; `add(Autoencoder(...))` expands into Dense layers, the decoder's
    weights tied to the encoder's (`share_from`, transposed) when `param_share`."""

    def __init__(self, name='my model', argv=None, label=False):
        super().__init__(name=name, argv=argv, label=label)

    def add(self, layer):
        if getattr(layer, 'layer_type', None) != 'AutoEncoder':
            super().add(layer)
            return
        hid = layer.hid_dim
        if layer.param_share:
            for i in range(1, len(hid) + 1):
                parw = Parameter(name='w', init='none', level=i)
                parb = Parameter(name='b', init='none', level=i)
                activation = None if i == len(hid) else layer.activation
                self.layers.append(Dense(hid[i - 1], w_param=parw, b_param=parb,
                                         activation=activation))
            for i in range(len(hid), 0, -1):
                parw = Parameter(name=generate_name('w', 2), init='none')
                parb = Parameter(name=generate_name('b', 2), init='none')
                parw.param.share_from = f'w{i}'
                parb.param.name = f'b{i}'
                dim = layer.out_dim if i == 1 else hid[i - 2]
                self.layers.append(Dense(dim, w_param=parw, b_param=parb,
                                         activation=layer.activation, transpose=True))
        else:
            for i in range(1, len(hid) + 2):
                parw = Parameter(name='w', init='none', level=i)
                parb = Parameter(name='b', init='none', level=i)
                dim = layer.out_dim if i == len(hid) + 1 else hid[i - 1]
                self.layers.append(Dense(dim, w_param=parw, b_param=parb,
                                         activation=layer.activation))


class Store:
    """StoreProto fields (path, backend, batchsize, shape, mean_value, ...)."""

    def __init__(self, **kwargs):
        self.proto = job_pb2.StoreProto()
        setval(self.proto, **kwargs)


class Algorithm:
    """train_one_batch: `type` an AlgType (kBP by default; kCD takes cd_conf fields)."""

    def __init__(self, type=job_pb2.kBP, **kwargs):
        self.proto = job_pb2.AlgProto(alg=type)
        if type == job_pb2.kCD:
            setval(self.proto.cd_conf, **kwargs)


class Updater:
    """UpdaterProto of `upd_type` with base learning rate `lr`; `lr_type` None/'fixed' →
    kFixed, 'step' → kStep (change_freq 60, gamma 0.997), 'manual' → kFixedStep(step,
    step_lr), 'linear' → kLinear (change_freq 10, final_lr 0.1), as SINGA's."""

    def __init__(self, upd_type, lr, lr_type, decay, momentum, step, step_lr, **fields):
        upd = job_pb2.UpdaterProto(type=upd_type)
        setval(upd, **fields)
        upd.learning_rate.base_lr = lr
        if decay > 0:
            upd.weight_decay = decay
        if momentum > 0:
            upd.momentum = momentum
        lr_conf = upd.learning_rate
        if lr_type in (None, 'fixed'):
            lr_conf.type = job_pb2.kFixed
        elif lr_type == 'step':
            lr_conf.type = job_pb2.kStep
            lr_conf.step_conf.change_freq, lr_conf.step_conf.gamma = 60, 0.997
        elif lr_type == 'manual':
            lr_conf.type = job_pb2.kFixedStep
            lr_conf.fixedstep_conf.step.extend(_list(step))
            lr_conf.fixedstep_conf.step_lr.extend(_list(step_lr))
        elif lr_type == 'linear':
            lr_conf.type = job_pb2.kLinear
            lr_conf.linear_conf.change_freq, lr_conf.linear_conf.final_lr = 10, 0.1
        else:
            raise ConfigError(f"{type(self).__name__}: lr_type {lr_type!r} is not known (None, "
                              f"'fixed', 'step', 'manual' or 'linear')")
        self.proto = upd
        self.singaupdater = None

    def Update(self, step, layer):
        """Update `layer`'s params with their gradients at `step` (the interactive API)."""
        if self.singaupdater is None:
            self.singaupdater = LayerUpdater(self.proto)
        self.singaupdater.update(step, layer)


class SGD(Updater):
    def __init__(self, lr=0.01, lr_type=None, decay=0, momentum=0, step=(0,), step_lr=(0.01,),
                 **fields):
        super().__init__(job_pb2.kSGD, lr, lr_type, decay, momentum, step, step_lr, **fields)


class AdaGrad(Updater):
    def __init__(self, lr=0.01, lr_type=None, decay=0, momentum=0, step=(0,), step_lr=(0.01,),
                 **fields):
        super().__init__(job_pb2.kAdaGrad, lr, lr_type, decay, momentum, step, step_lr, **fields)


class Cluster:
    """ClusterProto: the `workspace` (required) and the topology."""

    def __init__(self, workspace=None, nworker_groups=1, nserver_groups=1, nworkers_per_group=1,
                 nservers_per_group=1, nworkers_per_procs=1, nservers_per_procs=1, **fields):
        if not workspace:
            raise ConfigError("Cluster: workspace is required")
        self.proto = job_pb2.ClusterProto(
            workspace=workspace, nworker_groups=nworker_groups, nserver_groups=nserver_groups,
            nworkers_per_group=nworkers_per_group, nservers_per_group=nservers_per_group,
            nworkers_per_procs=nworkers_per_procs, nservers_per_procs=nservers_per_procs)
        setval(self.proto, **fields)


def _as_data(data, y, phase, batch_size, what):
    """A Data layer of `phase` (and no other) from numpy samples (with labels `y`) or from a
    Data layer: a copy of it, whatever phase it was made for (a `Data(x=...)` keeps its
    default phase 'train' when given as test or validation data), the caller's untouched."""
    if data is None:
        raise ConfigError(f"{what}: no data given")
    if isinstance(data, tuple) and len(data) == 2 and y is None:
        data, y = data
    name = job_pb2.Phase.Name(phase)[1:].lower()
    if isinstance(data, np.ndarray):
        return Data(x=data, y=y, phase=name, batch_size=batch_size or 64)
    if not getattr(data, 'is_datalayer', False):
        raise ConfigError(f"{what}: data must be a Data layer or a numpy array, "
                          f"got {type(data).__name__}")
    own = _copy_data(data)
    own.layer.ClearField('include')
    own.layer.ClearField('exclude')
    own.layer.include.append(phase)
    if batch_size is not None:
        del own.layer.store_conf.batchsize[:]
        own.layer.store_conf.batchsize.append(batch_size)
    return own


def _copy_data(data):
    """A copy of Data layer `data` with a LayerProto of its own."""
    own = copy.copy(data)
    own.layer = job_pb2.LayerProto()
    own.layer.CopyFrom(data.layer)
    return own


def _net_of(net, phase):
    """The layers of NetProto `net` in `phase`, as a net for every phase (no include/exclude)."""
    out = job_pb2.NetProto()
    for ly in net.layer:
        if _in_phase(ly, phase):
            new = out.layer.add()
            new.CopyFrom(ly)
            new.ClearField('include')
            new.ClearField('exclude')
    return out


def _phase(name):
    return {'train': kTrain, 'val': kVal, 'validation': kVal, 'test': kTest}.get(name, name)


def _in_phase(ly, phase):
    ly = getattr(ly, 'layer', ly)
    return phase not in ly.exclude and (not ly.include or phase in ly.include)


def _list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]
