"""SINGA's proto builders of the Python API (tool/python/singa/model.py's Store, Algorithm,
Updater and its optimizers, Cluster): each holds the proto it builds as `proto`. `singa.model`
re-exports them (`from singa.model import SGD`)."""
from singa.errors import ConfigError
from singa.layer import LayerUpdater, setval
from singa.proto import job_pb2

__all__ = ["Store", "Algorithm", "Updater", "SGD", "AdaGrad", "Nesterov", "RMSProp", "AdaDelta",
           "RMSprop", "Adadelta", "Adam", "AdamMax", "Cluster", "OPTIMIZERS", "COMPUTED", "LOSSES",
           "updater_of", "loss_of", "as_list", "put_device"]


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
    step_lr), 'linear' → kLinear (change_freq 10, final_lr 0.1), as SINGA's. A function `lr`
    of the step gives each step's rate (fit writes it into the job as LearningRateScheduler
    does)."""

    def __init__(self, upd_type, lr, lr_type, decay, momentum, step, step_lr, **fields):
        upd = job_pb2.UpdaterProto(type=upd_type)
        setval(upd, **fields)
        self.schedule = lr if callable(lr) else None
        if self.schedule is not None:
            if lr_type is not None:
                raise ConfigError(f"{type(self).__name__}: a function lr gives every step's rate; "
                                  f"drop lr_type {lr_type!r}")
            lr = 0.0    # the table fit writes replaces it
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
            lr_conf.fixedstep_conf.step.extend(as_list(step))
            lr_conf.fixedstep_conf.step_lr.extend(as_list(step_lr))
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


class Nesterov(Updater):
    """kNesterov: SGD with Nesterov momentum (`momentum`, default 0.9)."""

    def __init__(self, lr=0.01, lr_type=None, decay=0, momentum=0.9, step=(0,),
                 step_lr=(0.01,), **fields):
        super().__init__(job_pb2.kNesterov, lr, lr_type, decay, momentum, step, step_lr, **fields)


class RMSProp(Updater):
    """kRMSProp: running mean of g² with factor `rho` (default 0.9), as Keras' RMSprop."""

    def __init__(self, lr=0.001, rho=0.9, lr_type=None, decay=0, step=(0,), step_lr=(0.01,),
                 **fields):
        super().__init__(job_pb2.kRMSProp, lr, lr_type, decay, 0, step, step_lr,
                         rmsprop_conf=job_pb2.RMSPropProto(rho=rho), **fields)


class AdaDelta(Updater):
    """kAdaDelta: running means of g² and of the update², factor `rho` (default 0.95, Keras')."""

    def __init__(self, lr=1.0, rho=0.95, lr_type=None, decay=0, step=(0,), step_lr=(0.01,),
                 **fields):
        super().__init__(job_pb2.kAdaDelta, lr, lr_type, decay, 0, step, step_lr,
                         adadelta_conf=job_pb2.AdaDeltaProto(rho=rho), **fields)


#: Keras' spellings
RMSprop = RMSProp
Adadelta = AdaDelta


class Adam(Updater):
    """kAdam: moment factors `beta1`, `beta2` (defaults 0.9, 0.999)."""

    def __init__(self, lr=0.001, beta1=0.9, beta2=0.999, lr_type=None, decay=0, step=(0,),
                 step_lr=(0.01,), **fields):
        super().__init__(job_pb2.kAdam, lr, lr_type, decay, 0, step, step_lr,
                         adam_conf=job_pb2.AdamProto(beta1=beta1, beta2=beta2), **fields)


class AdamMax(Updater):
    """kAdamMax: Adam's infinity-norm variant, factors `beta1`, `beta2`."""

    def __init__(self, lr=0.002, beta1=0.9, beta2=0.999, lr_type=None, decay=0, step=(0,),
                 step_lr=(0.01,), **fields):
        super().__init__(job_pb2.kAdamMax, lr, lr_type, decay, 0, step, step_lr,
                         adammax_conf=job_pb2.AdamMaxProto(beta1=beta1, beta2=beta2), **fields)


#: compile's optimizer names
OPTIMIZERS = {'sgd': SGD, 'adagrad': AdaGrad, 'nesterov': Nesterov, 'rmsprop': RMSProp,
              'adadelta': AdaDelta, 'adam': Adam, 'adamax': AdamMax}
#: compile's loss names, each with the metrics its layers compute (the loss first)
COMPUTED = {'categorical_crossentropy': ('loss', 'accuracy', 'acc'),
            'mean_squared_error': ('loss', 'mae', 'mse'),
            'reconstruction': ('loss',)}
#: aliases of compile's loss names (Keras' and SINGA's)
LOSSES = {'sparse_categorical_crossentropy': 'categorical_crossentropy',
          'mse': 'mean_squared_error', 'euclidean': 'reconstruction',
          'euclideanloss': 'reconstruction'}


def updater_of(optimizer):
    """compile's `optimizer`: an Updater, or the name of one in OPTIMIZERS (its defaults)."""
    if optimizer is None:
        raise ConfigError("compile: optimizer (an Updater such as SGD, or 'sgd') is required")
    if isinstance(optimizer, str):
        if optimizer.lower() not in OPTIMIZERS:
            raise ConfigError(f"compile: optimizer {optimizer!r} is not known "
                              f"({', '.join(map(repr, OPTIMIZERS))}, or an Updater)")
        optimizer = OPTIMIZERS[optimizer.lower()]()
    if not isinstance(optimizer, Updater):
        raise ConfigError(f"compile: optimizer must be an Updater (SGD(lr=...), ...) or its "
                          f"name, got {type(optimizer).__name__}")
    return optimizer


def loss_of(loss, metrics):
    """compile's `loss` by its own name (one of COMPUTED, or None; LOSSES' aliases resolved),
    once every one of `metrics` is one its layers compute."""
    loss = LOSSES.get(loss, loss)
    if loss is not None and loss not in COMPUTED:
        raise ConfigError(f"compile: loss {loss!r} is not known "
                          f"({', '.join(map(repr, COMPUTED))}, or their aliases "
                          f"{', '.join(map(repr, LOSSES))})")
    computed = COMPUTED.get(loss, ())
    for name in as_list(metrics) if metrics is not None else ():
        if name not in computed:
            raise ConfigError(f"compile: metric {name!r} is not computed by the "
                              f"{loss or 'model'}'s layers (they give "
                              f"{', '.join(computed[:2]) or 'none'})")
    return loss


class Cluster:
    """ClusterProto: the `workspace` (required), the topology and its other fields; a job of
    several processes is launched with the ZooKeeper at `zookeeper_host` ("host:port"; by
    default conf/singa.conf's). `gpu`: the job's GPU ids, given to each process's workers in
    order (the workers beyond them run on the CPU)."""

    def __init__(self, workspace=None, nworker_groups=1, nserver_groups=1, nworkers_per_group=1,
                 nservers_per_group=1, nworkers_per_procs=1, nservers_per_procs=1,
                 zookeeper_host=None, gpu=(), **fields):
        if not workspace:
            raise ConfigError("Cluster: workspace is required")
        ids = {}
        put_device(ids, gpu, 'Cluster')
        self.gpu = ids.get('gpu', [])
        unknown = [k for k in fields if k not in job_pb2.ClusterProto.DESCRIPTOR.fields_by_name]
        if unknown:
            raise ConfigError(f"Cluster: {unknown[0]!r} is no ClusterProto field")
        self.zookeeper_host = zookeeper_host
        self.proto = job_pb2.ClusterProto(
            workspace=workspace, nworker_groups=nworker_groups, nserver_groups=nserver_groups,
            nworkers_per_group=nworkers_per_group, nservers_per_group=nservers_per_group,
            nworkers_per_procs=nworkers_per_procs, nservers_per_procs=nservers_per_procs)
        setval(self.proto, **fields)


def as_list(value):
    """`value` as a list: a list or tuple's items, else `value` alone (SINGA's helpers took
    either)."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def put_device(fields, device, what):
    """SINGA's `device` (GPU ids: [0], or 0) as the job's `gpu` field: worker i runs on GPU
    device[i], the workers beyond them on the CPU."""
    if device is None:
        return
    ids = [device] if isinstance(device, int) else device
    if isinstance(ids, (str, bytes)) or not hasattr(ids, '__iter__') or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConfigError(f"{what}: device must list GPU ids, e.g. [0]; got {device!r}")
    fields['gpu'] = list(ids)
