"""SINGA 0.3's Keras-like Python API (tool/python/singa/model.py): build a JobProto from
layers, then train, test and predict through `singa.api.session` (SINGA's proto builders,
data feeding, fit's schedule and resume point and saved models are in `singa.api` too).

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
import itertools
import os
import signal
import sys

import numpy as np
from google.protobuf import text_format

from singa import checkpoint, naming
from singa.api import feed, saved, schedule, session
from singa.api.builders import (  # noqa: F401  (SINGA's names, re-exported)
    LOSSES, OPTIMIZERS, SGD, AdaDelta, Adadelta, AdaGrad, Adam, AdamMax, Algorithm, Cluster,
    Nesterov, RMSProp, RMSprop, Store, Updater)
from singa.api.builders import as_list, loss_of, put_device, updater_of
from singa.api.resume import continue_from, resume_point
from singa.api.summary import summary_lines
from singa.callbacks import CallbackList, EpochLines, LearningRateScheduler, StepLines
from singa.cluster import launch
from singa.errors import ConfigError
from singa.io import memory
from singa.job import config
from singa.layer import (Accuracy, Data, Dense, Layer, Loss, check_input_shape, enumAlgType,
                        generate_name, load_model_parameter, save_model_parameter, setval)
from singa.layer import *  # noqa: F401,F403  (SINGA's `from singa.model import *` gives them)
from singa.parameter import Parameter
from singa.proto import job_pb2
from singa.watch.metrics import History

__all__ = ["Model", "load_model", "Sequential", "Energy", "Store", "Algorithm", "Updater", "SGD",
           "AdaGrad", "Nesterov", "RMSProp", "RMSprop", "AdaDelta", "Adadelta", "Adam",
           "AdamMax", "Cluster", "History", "Parameter", "load_model_parameter",
           "save_model_parameter"]
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
        self.inputs = []          # Keras' Input objects: a sample shape, no layer
        self.label = label
        self.argv = argv
        self.result = None
        self.last_checkpoint_path = None
        self.cudnn = False
        self.accuracy = False
        self.conf_net = None      # the NetProto of a model loaded by from_conf
        self.loaded = False       # loaded by load_model: a model (not a conf) with params
        self.best_monitor = None  # what ranks the snapshots of the last fit ('best')
        self.zookeeper_host = None    # of a job of several processes (Cluster's)
        self.lr_schedule = None       # a function of the step given as the updater's lr
        self.fed = None     # the (x, y) or data the last fit was given (a next fit continues)
        self.stop_training = False    # a callback stops the running fit (Keras' flag)
        naming.reset_names()      # its generated names depend on its own layers only

    # --- building ---------------------------------------------------------------------------
    def add(self, layer):
        """Append `layer`; a Data layer whose name was generated is added as a copy named where
        it joins (`data<n>`, the model's counter), as SINGA's helper named it in a fresh
        process, wherever the script made it: its reader position resumes by that name. A
        Keras `Input(shape=)` adds no layer: the samples fed are checked against its shape."""
        if getattr(layer, 'is_input', False):
            self.inputs.append(layer)
            return
        if getattr(layer, 'generated_name', False):
            layer = feed.copy_data(layer)
            layer.layer.name = generate_name('data')
        self.layers.append(layer)

    def exist_datalayer(self, phase):
        return any(_phase(phase) in ly.layer.include for ly in self.layers if ly.is_datalayer)

    def compile(self, optimizer=None, cluster=None, loss=None, topk=1, metrics=None):
        """Set the updater (`optimizer`: an Updater such as SGD(lr=0.01), or a name: 'sgd',
        'adagrad', 'rmsprop', 'nesterov', 'adadelta', 'adam', 'adamax', with their defaults)
        and `cluster` (a Cluster with the workspace); `loss` 'categorical_crossentropy' (alias
        'sparse_categorical_crossentropy': labels are class indices, or one-hot rows) turns a
        last softmax into kSoftmaxLoss (or adds one); 'mean_squared_error' (alias 'mse') adds
        Keras' mean squared error against y (kMSELoss: float y, (N,) or (N, k), are regression
        targets, and so are integer y given to it), unless the model's data have no y (fit(x)
        alone, or a store of SINGA's records, as SINGA's Autoencoder scripts train): then it is
        SINGA's reconstruction of the input; the first data the model has decide, for good;
        'reconstruction' (alias 'euclidean') is always SINGA's (kEuclideanLoss against x; a
        last softmax turned into it). `metrics`: what the loss layer computes, ['accuracy'] of
        a softmax loss, ['mae'] of the mean squared error (they are always computed); others
        are refused."""
        if cluster is None:
            raise ConfigError("compile: cluster (a Cluster with a workspace) is required")
        optimizer = updater_of(optimizer)
        self.jobconf.updater.CopyFrom(optimizer.proto)
        self.jobconf.cluster.CopyFrom(cluster.proto)
        self.jobconf.ClearField('gpu')
        self.jobconf.gpu.extend(cluster.gpu)
        self.zookeeper_host = cluster.zookeeper_host
        self.lr_schedule = optimizer.schedule
        loss = loss_of(loss, metrics)
        if loss is None:
            return
        if not self.layers:
            raise ConfigError("compile: add layers before compiling")
        added = _loss_layer(self.layers[-1], loss, topk)
        if added is not None:
            self.add(added)
            feed.match_loss(self.layers)

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
            _add_accuracy(net, self.layers[-1].layer.name, self.layers[0].layer.name)
        self.jobconf.neuralnet.CopyFrom(net)
        return net

    def to_conf(self, path=None):
        """The text JobProto of the model, what `singa-run.sh -conf` runs: its paths absolute
        (the Python API resolves them against the current directory, the command line against
        the SINGA home). With `path`, also written there (whole or not at all), its numpy data
        as kvfiles beside it (`<conf name>-<layer>-<phases>.bin`); without, numpy data are an
        error: they live in this process only."""
        self.build()
        return saved.conf_text(config.absolute_paths(session.copy_job(self.jobconf), os.getcwd()),
                               path)

    @classmethod
    def from_conf(cls, path, user_proto=(), user_layers=()):
        """A model of the job conf at `path` (relative to the current directory): `fit` trains
        it as `singa-run.sh -conf` would, `evaluate` and `predict` use its nets. `user_proto`
        and `user_layers` (files, as singa-run.sh's flags) join the conf's own extensions.
        ConfigError naming `path` for a net with a param or layer array larger than this
        machine's memory (`singa.cluster.launch.check_memory`: nothing is allocated)."""
        extra = {field: [os.path.abspath(p) for p in as_list(paths)]
                 for field, paths in (('user_proto', user_proto), ('user_layers', user_layers))}
        job = config.load_job(os.path.abspath(path), check_paths=False, **extra)
        launch.check_memory(job, path)
        for field, paths in extra.items():
            getattr(job, field).extend(paths)
        m = cls(job.name)
        m.jobconf = job
        m.conf_net = job.neuralnet
        return m

    def display(self):
        """Print the JobProto as text."""
        print(text_format.MessageToString(self.jobconf))

    def summary(self):
        """Print Keras' summary of the net: each layer's output shape per sample and params,
        and the totals. A model without a Data layer takes the sample shape of its `Input`
        or first layer's `input_shape`."""
        if self.conf_net is not None or any(item.is_datalayer for item in self.layers):
            print("\n".join(summary_lines(self.build())))
            return
        shape = next((ly.input_shape for ly in self.inputs + self.layers
                      if getattr(ly, 'input_shape', None)), None)
        if shape is None:
            raise ConfigError("summary: the model has no data yet: give its first layer "
                              "input_shape=(...) or add Input(shape=(...))")
        print("\n".join(summary_lines(self._build_reading(
            np.zeros((1,) + tuple(shape), np.float32), 'train'))))

    # --- running ------------------------------------------------------------------------------
    def fit(self, data_or_x=None, y=None, nb_epoch=0, batch_size=None, with_test=False,
            test_steps=None, test_freq=None, disp_freq=None, checkpoint_freq=None,
            resume=False, *, alg=None, test_data=None, validate_data=None,
            validation_data=None, validation_split=None, epochs=None, callbacks=(),
            verbose=False, progress=True, execpath='', device=None, steps_per_epoch=None,
            validation_steps=None, **fields):
        """Train for `nb_epoch` steps (SINGA's meaning: train steps, not passes over the
        data), or `epochs` passes over the data given, on `data_or_x`: a Data layer, numpy
        samples with labels `y`, (x, y), or an iterable of (x, y) batches (data larger than
        memory: written once as a kvfile in `<workspace>/data`, then read as a store) (SINGA's
        keyword `data=` too). Returns a History. `steps_per_epoch` (Keras'): an epoch is that
        many steps, and of an iterable (an endless generator too) fit takes that many batches
        for each epoch, in order (a generator's augmentation stays per epoch); with nb_epoch
        (steps) it takes at most nb_epoch batches. `validation_steps`: the batches of each
        validation (of an iterable: its first ones, taken once).

        A second `fit` of the model continues from the params the first one left (its final
        snapshot, bit-exact) for `nb_epoch` (or `epochs`) more steps; a new model starts
        afresh. `resume`: continue from the newest complete snapshot in the workspace, that
        of an earlier process too; `nb_epoch` is then the step to reach.

        `batch_size`: of numpy samples (default 64; at most their number, as Keras), else the
        new batch size of the train data layer. `with_test`: also test during training, every
        `test_freq` steps (default nb_epoch/10, or each pass for `epochs`) on `test_data` (a
        Data layer, or numpy (x, y): every sample once, unless `test_steps` batches are asked
        for) or the model's test data layer (`test_steps` batches, default 10); with no test
        data it means what SINGA's meant, test later (`evaluate`), and fit only trains.
        `validation_data` (alias `validate_data`) or `validation_split` (the last fraction of
        numpy x, y) likewise validates (`validate_freq`, `validate_steps`). Tests and
        validations run at the last step too. `callbacks`: singa.callbacks objects
        (EarlyStopping, ModelCheckpoint, LearningRateScheduler, LambdaCallback, or a Callback
        of your own). `disp_freq`: train metrics every so many steps (default as test_freq);
        `checkpoint_freq`: a snapshot every so many steps (one is written at the end in any
        case). `alg`: 'bp' (default), 'bptt' or 'cd'. Other keywords set JobProto fields
        (`seed`, `checkpoint_path`, ...). `verbose`: Keras' 0 (silent), 1 (a progress bar)
        or 2 (a line per epoch on stdout), or SINGA's helper's True (its log lines on stderr)
        and False (default: a progress bar, as `progress` says). `device`: GPU ids, e.g. [0] (SINGA's helper's; the job's `gpu`).
        A model loaded by `from_conf` trains as its conf says (nb_epoch 0: its train_steps;
        its tests) unless told otherwise."""
        if execpath:
            raise ConfigError("fit: execpath (a SINGA binary) is not used: the job runs in "
                              "this Python")
        put_device(fields, device, 'fit')
        fields.update((key, value) for key, value in (
            ('test_steps', test_steps), ('test_freq', test_freq), ('disp_freq', disp_freq),
            ('checkpoint_freq', checkpoint_freq)) if value is not None)
        data_or_x, y, validate_data = _fit_data(data_or_x, y, fields, validate_data,
                                                validation_data, validation_split)
        schedule.check_epochs(epochs, nb_epoch)
        schedule.check_count('fit', 'steps_per_epoch', steps_per_epoch)
        schedule.check_count('fit', 'validation_steps', validation_steps)
        if steps_per_epoch is not None and epochs is None and not nb_epoch:
            epochs = 1      # Keras' default
        if validation_steps is not None:
            fields['validate_steps'] = validation_steps
        job = config.absolute_paths(self._job(fields), os.getcwd())
        fed = self.fed
        self._feed_fit(data_or_x, y, validate_data, test_data, batch_size,
                       schedule.pulls(nb_epoch, epochs, steps_per_epoch), validation_steps)
        self._schedule(job, fields, nb_epoch, epochs, with_test, validate_data is not None, alg,
                       steps_per_epoch)
        start = None if resume else continue_from(job, self.last_checkpoint_path,
                                                  _same_data(fed, self.fed))
        verbose, progress, lines = _verbosity(verbose, progress, epochs)
        callbacks = CallbackList(([LearningRateScheduler(self.lr_schedule)]
                                  if self.lr_schedule is not None else []) + list(callbacks)
                                 + lines, self, epochs, start or 0)
        callbacks.configure(job)
        self.best_monitor = job.checkpoint_keep_best or None
        job = session.prepare(job)
        snap = resume_point(job, resume, start, self.last_checkpoint_path)
        history = session.train(job, snap or resume, verbose, progress, callbacks.begin(snap),
                                self.zookeeper_host)
        if history.snapshots:
            self.last_checkpoint_path = history.snapshots[-1][1]
        self.result = history
        callbacks.end(history)
        if history.stopped_by:
            _say_stopped(history)
            session.deliver(history.stopped_by)
        return history

    def _feed_fit(self, data_or_x, y, validate_data, test_data, batch_size, pulls,
                  validation_steps):
        """The data fit was given as the model's train, validation and test data; the train
        data remembered (`fed`). Without train data, its own (or none: an error) in batches
        of `batch_size` when given. `pulls`: (the batches to take of an iterable of train
        batches, whether exactly: `schedule.pulls`); `validation_steps` those of validation."""
        if data_or_x is not None or not (self.conf_net is not None
                                         or self.exist_datalayer('train')):
            self._feed(data_or_x, y, kTrain, batch_size, 'fit', *pulls)
            self.fed = data_or_x if isinstance(data_or_x, tuple) else (data_or_x, y)
        elif batch_size is not None:
            feed.set_batchsize(self._data_protos(), kTrain, batch_size)
        for key, data, phase, steps in (('validation_data', validate_data, kVal,
                                         validation_steps),
                                        ('test_data', test_data, kTest, None)):
            if data is not None:
                self._feed(data, None, phase, batch_size, 'fit: ' + key, steps,
                           steps is not None)

    def _schedule(self, job, fields, nb_epoch, epochs, with_test, validating, alg,
                  steps_per_epoch=None):
        """Set `job` to train the model's net (`singa.api.schedule`), its Data layers'
        checkpoints loaded (unless `fields` name a checkpoint_path), by `alg` if given."""
        per_pass = None if epochs is None else steps_per_epoch or feed.steps_per_pass(
            [item.layer for item in self.layers if item.is_datalayer], self._streams_folder())
        as_conf = self.conf_net is not None and not self.loaded
        steps = schedule.train_steps(nb_epoch, epochs, per_pass, as_conf)
        job.neuralnet.CopyFrom(self.build())
        schedule.check_loss(job)
        schedule.plan(job, fields, steps, per_pass, with_test, validating, as_conf,
                      self._streams_folder())
        if 'checkpoint_path' not in fields:
            job.checkpoint_path.extend(p for item in self.layers if item.is_datalayer
                                       for p in as_list(getattr(item, 'checkpoint', None) or []))
        if alg is not None:
            job.train_one_batch.alg = enumAlgType(alg)

    def evaluate(self, data=None, y=None, alg=None, checkpoint_path=None, execpath='',
                 device=None, show_acc=False, batch_size=None, verbose=1, steps=None,
                 **fields):
        """Test the params of `checkpoint_path` (files, "latest" or "best"; by default the
        newest snapshot `fit` wrote) on `data`: numpy samples with labels `y` or an iterable
        of (x, y) batches (every sample once, a last partial batch counted by its size;
        batches of `batch_size`, default 64), or a Data layer (`test_steps` batches, default
        10, SINGA's meaning; numpy data too when `test_steps` is given). `steps` (Keras'):
        that many batches (of an iterable, its first ones). Returns {metric: value}. `verbose`: 1 (default) prints the result in one line, 0 nothing, 2 also
        SINGA's log lines (stderr)."""
        if execpath:
            raise ConfigError("evaluate: execpath (a SINGA binary) is not used: the job runs "
                              "in this Python")
        put_device(fields, device, 'evaluate')
        schedule.check_count('evaluate', 'steps', steps)
        if steps is not None:
            fields.setdefault('test_steps', steps)
        job = self._job(fields)
        if data is not None:
            self._feed(data, y, kTest, batch_size, 'evaluate', steps, steps is not None)
        elif batch_size is not None:
            feed.set_batchsize(self._data_protos(), kTest, batch_size)
        self.accuracy = show_acc
        net = self.build()
        whole, samples = feed.whole_pass(net, kTest, 'test_steps' in fields, self._streams_folder())
        job.neuralnet.CopyFrom(feed.net_of(net, kTest))
        job.test_steps = whole or fields.get('test_steps',
                                             job.test_steps if self.conf_net else 10) or 10
        job.train_steps = 0
        if alg is not None:
            job.train_one_batch.alg = enumAlgType(alg)
        self._load_params(job, checkpoint_path, 'evaluate')
        tested = {}
        metrics = session.test(session.prepare(job), verbose == 2 or verbose is True,
                               lambda step, phase, values: tested.update(step=step))
        if verbose:
            size = f"{samples} samples" if whole else f"{job.test_steps} batches"
            print(f"Test @ step {tested.get('step', 0)} on {size}:  "
                  + ", ".join(f"{k} = {v:.6f}" for k, v in metrics.items()))
        self.result = metrics
        return metrics

    def predict(self, x, checkpoint_path=None, device=None, steps=None):
        """The net's outputs for the numpy samples `x` (or each batch of an iterable, joined:
        its first `steps` batches when given) (probabilities for a softmax net), with the
        params `fit` left or those of
        `checkpoint_path`; `x` gets the preprocessing of the model's (test, else train) data
        layer, and is fed as it is when the model has none. `device`: GPU ids, e.g. [0] (the
        net runs on the first)."""
        schedule.check_count('predict', 'steps', steps)
        if not isinstance(x, np.ndarray) and hasattr(x, '__iter__') and not isinstance(x, list):
            outs = [self.predict(item[0] if isinstance(item, tuple) else item, checkpoint_path,
                                 device) for item in itertools.islice(x, steps)]
            if not outs:
                raise ConfigError("predict: the iterable of batches gave no samples")
            return np.concatenate(outs)
        fields = {}
        put_device(fields, device, 'predict')
        job = self._job(fields)
        if self.conf_net is None and not any(item.is_datalayer for item in self.layers):
            # the input layer of x's samples (predict feeds them in batches of its own)
            x = np.asarray(x)
            net = self._build_reading(x[:1], 'test')
        else:
            net = self.build()
        job.neuralnet.CopyFrom(feed.predict_net(net))
        job.train_steps, job.test_steps, job.validate_steps = 0, 0, 0
        self._load_params(job, checkpoint_path, 'predict')
        return session.predict(session.prepare(job), x)

    # --- saving -------------------------------------------------------------------------------
    def save(self, path):
        """Write the model to the folder `path` (made if missing; what it holds of an earlier
        save is replaced): `job.conf`, the model's job, whose input layers keep their
        preprocessing (numpy inputs as layers without data, mean/std files copied beside it),
        and the params of its last fit (the final snapshot's files, their `checkpoint_path`).
        `load_model(path)` gives the model back in any process."""
        if self.last_checkpoint_path is None:
            raise ConfigError("save: the model has no params yet: fit it first")
        job = config.absolute_paths(session.copy_job(self.jobconf), os.getcwd())
        job.neuralnet.CopyFrom(self.build())
        saved.save(path, config.absolute_paths(job, os.getcwd()), self.last_checkpoint_path)

    # --- helpers ------------------------------------------------------------------------------
    def _build_reading(self, sample, phase):
        """The NetProto of a model without a data layer, a Data layer of `phase` reading the
        numpy `sample` (a batch of one) first; the model's layers as they were afterwards."""
        self.layers.insert(0, Data(x=sample, phase=phase, batch_size=1))
        try:
            return self.build()
        finally:
            memory.release(self.layers.pop(0).layer.store_conf.path)

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

    def _feed(self, data, y, phase, batch_size, what, steps=None, exact=False):
        """Make `data` (numpy samples with labels `y`, an iterable of (x, y) batches, `steps`
        of them at most or `exact`ly, or a Data layer: `feed.as_data`) the model's input of
        `phase`."""
        own = feed.as_data(data, y, phase, batch_size, what, self._streams_folder(), steps,
                           exact)
        protos = [p for item in self.layers for p in (item.layer, getattr(item, 'mask', None))
                  if p is not None]
        feed.check_input(own, protos if self.conf_net is None else self.conf_net.layer, what)
        if hasattr(own, 'samples') and self.conf_net is None:
            check_input_shape(self.inputs + self.layers, own.samples[0], what)
        if self.conf_net is not None:
            self.conf_net = feed.put_conf_data(self.conf_net, own, phase)
        else:
            self.layers = feed.put_data(self.layers, own, phase)

    def _data_protos(self):
        """The LayerProtos of the model's data layers (a conf's: every layer)."""
        if self.conf_net is not None:
            return self.conf_net.layer
        return [item.layer for item in self.layers if item.is_datalayer]

    def _streams_folder(self):
        """Where iterables of batches are written as kvfiles: `<workspace>/data`."""
        if not self.jobconf.cluster.workspace:
            raise ConfigError("compile the model with a Cluster (its workspace) first")
        return feed.streams_folder(self.jobconf.cluster.workspace)

    def _load_params(self, job, checkpoint_path, what):
        """Set `job` to load the params of `checkpoint_path` ("best" ranked by the last fit's
        monitor, when it had one), else of the last fit's final snapshot (or those a conf
        made to test names)."""
        if checkpoint_path is not None:
            files = as_list(checkpoint_path)
            if 'best' in files and self.best_monitor:
                folder = checkpoint.folder(os.path.abspath(self.jobconf.cluster.workspace))
                snap = checkpoint.best_snapshot(folder, self.best_monitor)
                if snap is None:
                    raise ConfigError(f"{what}: checkpoint_path 'best': no complete snapshot "
                                      f"in {folder} records {self.best_monitor}")
                best = [snap.files[w] for w in sorted(snap.files)]
                files = [f for e in files for f in (best if e == 'best' else [e])]
        elif self.last_checkpoint_path is not None:
            files = checkpoint.files_of(self.last_checkpoint_path)
        elif self.conf_net is not None and self.jobconf.checkpoint_path:
            files = list(self.jobconf.checkpoint_path)
        else:
            raise ConfigError(f"{what}: no params: fit the model first or give checkpoint_path")
        del job.checkpoint_path[:]
        job.checkpoint_path.extend(files)


def load_model(path, workspace=None):
    """The model `Model.save` wrote to the folder `path`: it predicts, evaluates (numpy data
    through its saved preprocessing) and fits on, as Keras' does: from the saved params,
    step and optimizer state (the snapshot's), with the displays and callbacks of a model's
    fit; its workspace is `workspace`, by default `<path>/workspace`."""
    conf, params = saved.load(path)
    m = Model.from_conf(conf)
    del m.jobconf.checkpoint_path[:]
    m.jobconf.checkpoint_path.extend(params)
    m.jobconf.cluster.workspace = os.path.abspath(workspace or os.path.join(path, 'workspace'))
    m.loaded, m.last_checkpoint_path = True, params[0]
    return m


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


def _loss_layer(last, loss, topk):
    """compile's `loss` ('categorical_crossentropy', 'mean_squared_error' or 'reconstruction')
    after the model's last layer `last`: its softmax (or its activation's) turned into the loss
    layer (None), else the Loss layer to add; that of 'mean_squared_error' is SINGA's
    reconstruction until the model's data decide (`keras_mse`, `feed.match_loss`)."""
    if loss == 'mean_squared_error':
        added = Loss('euclideanloss')
        added.keras_mse = True
        return added
    ly = last.mask if getattr(last, 'mask', None) is not None else last.layer
    if ly.type != job_pb2.kSoftmax:
        return Loss('softmaxloss', topk=topk) if loss == 'categorical_crossentropy' \
            else Loss('euclideanloss')
    if loss == 'categorical_crossentropy':
        ly.type = job_pb2.kSoftmaxLoss
        ly.softmaxloss_conf.topk = topk
    else:
        ly.type = job_pb2.kEuclideanLoss
    return None


def _add_accuracy(net, top, data):
    """evaluate's show_acc: a softmax over layer `top` and an Accuracy layer against the labels
    of layer `data`, in the test phase of NetProto `net`."""
    sm = net.layer.add()
    sm.CopyFrom(Layer(name='softmax', type=job_pb2.kSoftmax).layer)
    sm.include.append(kTest)
    sm.srclayers.append(top)
    acc = net.layer.add()
    acc.CopyFrom(Accuracy().layer)
    acc.include.append(kTest)
    acc.srclayers.extend(['softmax', data])


def _fit_data(data_or_x, y, fields, validate_data, validation_data, validation_split):
    """fit's (x, y to train, data to validate): SINGA's `data=` keyword (in `fields`) for the
    first argument, validation_data alias validate_data, or Keras' validation_split."""
    for key in ('class_weight', 'sample_weight'):
        if key in fields:
            raise ConfigError(f"fit: {key} (Keras') has no SINGA meaning: the loss layers "
                              f"weigh every sample alike; repeat the samples to weigh")
    if 'data' in fields:        # SINGA's name of the first argument
        if data_or_x is not None:
            raise ConfigError("fit: give the data once (data_or_x or data=)")
        data_or_x = fields.pop('data')
    if validation_data is not None:
        if validate_data is not None:
            raise ConfigError("fit: give validation_data or validate_data, not both")
        validate_data = validation_data
    if validation_split is not None:
        if validate_data is not None:
            raise ConfigError("fit: give validation_split or validation_data, not both")
        data_or_x, y, validate_data = feed.split(data_or_x, y, validation_split)
    return data_or_x, y, validate_data


def _verbosity(verbose, progress, epochs):
    """fit's (SINGA's log lines, a progress bar, callbacks printing lines) of its `verbose`:
    True / False SINGA's helper's (its log lines on stderr, or not; the bar as `progress`
    says), or Keras' 0 (silent), 1 (a bar), 2 (a line per epoch, or per display)."""
    if isinstance(verbose, bool):
        return verbose, progress, []
    if verbose not in (0, 1, 2):
        raise ConfigError(f"fit: verbose must be 0 (silent), 1 (a progress bar), 2 (a line "
                          f"per epoch) or True (SINGA's log lines), got {verbose!r}")
    lines = [] if verbose != 2 else [EpochLines(epochs) if epochs else StepLines()]
    return False, progress and verbose == 1, lines


def _say_stopped(history):
    """The line of a fit a signal stopped: where, and that the model keeps those params."""
    name = signal.Signals(history.stopped_by).name
    if history.snapshots:
        step = history.snapshots[-1][0]
        print(f"singa: fit stopped by {name} at step {step}: the model holds the params of "
              f"step {step}, and fit(...) again continues from them", file=sys.stderr)
    else:
        print(f"singa: fit stopped by {name} before its first snapshot: the model holds no "
              f"new params", file=sys.stderr)


def _same_data(fed, now):
    """Whether a fit was given the very objects (x, y) the fit before it had."""
    return fed is not None and len(fed) == len(now) and all(a is b for a, b in zip(fed, now))


def _phase(name):
    return {'train': kTrain, 'val': kVal, 'validation': kVal, 'test': kTest}.get(name, name)
