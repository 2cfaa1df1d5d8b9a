"""Keras' callbacks over SINGA's machinery, for `Model.fit(..., callbacks=[...])`.

A callback hears the job's events as the metrics reach the launching process: `on_step_end`
at each display of the train metrics (every `disp_freq` steps), `on_test_end` at each test
and validation. Setting `self.model.stop_training = True` there stops the job after a
snapshot a step or two later: in a job of one process the events come from its worker as
they happen (the snapshot is asked for at the next step, which the worker may have begun);
in a job of several they come from its metrics.csv, read every half second, and the stop is
the launcher's SIGUSR1. Callbacks that map onto the job itself write
its fields in `configure` before it runs: ModelCheckpoint (snapshot retention:
`checkpoint_keep_best*`), LearningRateScheduler (a kFixedStep learning-rate table). Monitors are named as `checkpoint_keep_best` names them,
"[test/|validation/|train/]<metric>" (test when no phase is given), or as Keras does:
`val_<metric>` is "validation/<metric>".
"""
import math

from singa.checkpoint import lower_is_better
from singa.errors import ConfigError
from singa.proto import job_pb2

__all__ = ["Callback", "CallbackList", "LambdaCallback", "EarlyStopping", "ModelCheckpoint",
           "LearningRateScheduler", "monitor_name"]

#: the most learning-rate changes a LearningRateScheduler writes into the job
MAX_LR_CHANGES = 100000
PHASES = ("train", "validation", "test")


def monitor_name(name):
    """"<phase>/<metric>" of a monitor named as checkpoint_keep_best or Keras names it."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"monitor must name a metric ('validation/accuracy', 'val_loss', "
                          f"...), got {name!r}")
    phase, sep, metric = name.lower().rpartition("/")
    if not sep:
        for prefix, known in (("val_", "validation"), ("test_", "test"), ("train_", "train")):
            if metric.startswith(prefix):
                return f"{known}/{metric[len(prefix):]}"
        return f"test/{metric}"
    if phase not in PHASES:
        raise ConfigError(f"monitor {name!r}: the phase must be one of {', '.join(PHASES)}")
    return f"{phase}/{metric}"


class Callback:
    """What fit calls; `model` is the Model being fit (set by fit)."""
    model = None

    def configure(self, job):
        """Set the fields of the JobProto `job` this callback maps onto, before it runs."""

    def on_train_begin(self):
        pass

    def on_step_end(self, step, metrics):
        """The train metrics ({name: value}) displayed at `step`."""

    def on_test_end(self, step, phase, metrics):
        """The metrics of the test ('test') or validation ('validation') at `step`."""

    def on_train_end(self, history):
        pass

    #: whether the callback hears the job's events (else it only sets fields)
    hears_events = True


class CallbackList:
    """The callbacks of one fit of `model` (Keras' CallbackList): `configure` hands each the
    model and the job's fields, `begin` starts them and gives what the job calls at each event
    (`on_event`; None when none hears events), `end` hands them the History."""

    def __init__(self, callbacks, model):
        self.callbacks, self.model = list(callbacks), model
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise ConfigError(f"fit: callbacks must be singa.callbacks.Callback objects, got "
                                  f"{type(cb).__name__}")

    def configure(self, job):
        for cb in self.callbacks:
            cb.model = self.model
            cb.configure(job)

    def begin(self):
        self.model.stop_training = False
        for cb in self.callbacks:
            cb.on_train_begin()
        self.hearing = [cb for cb in self.callbacks if cb.hears_events]
        return self.on_event if self.hearing else None

    def on_event(self, step, phase, metrics):
        """Hand the event to the callbacks that hear events; True once they stop training."""
        for cb in self.hearing:
            if phase == "train":
                cb.on_step_end(step, dict(metrics))
            else:
                cb.on_test_end(step, phase, dict(metrics))
        return self.model.stop_training

    def end(self, history):
        for cb in self.callbacks:
            cb.on_train_end(history)


class LambdaCallback(Callback):
    """A callback of plain functions: `on_step_end(step, metrics)`, `on_test_end(step, phase,
    metrics)`; one that returns True stops training (as `model.stop_training = True`)."""

    def __init__(self, on_step_end=None, on_test_end=None):
        self.step_end, self.test_end = on_step_end, on_test_end

    def on_step_end(self, step, metrics):
        if self.step_end is not None and self.step_end(step, metrics) is True:
            self.model.stop_training = True

    def on_test_end(self, step, phase, metrics):
        if self.test_end is not None and self.test_end(step, phase, metrics) is True:
            self.model.stop_training = True


class _Watch:
    """The best value of a monitor: lower is better for loss-like metrics ('min'), else
    higher ('max'); `mode` 'auto' chooses by the name, as checkpoint_keep_best does."""

    def __init__(self, monitor, mode):
        self.monitor = monitor_name(monitor)
        self.phase, self.metric = self.monitor.split("/", 1)
        if mode not in ("auto", "min", "max"):
            raise ConfigError(f"mode must be 'auto', 'min' or 'max', got {mode!r}")
        self.lower = lower_is_better(self.metric) if mode == "auto" else mode == "min"

    def value(self, phase, metrics):
        """The monitored value among an event's metrics, or None (another phase); a phase
        without the metric is a ConfigError naming what it has."""
        if phase != self.phase:
            return None
        if self.metric not in metrics:
            raise ConfigError(f"monitor '{self.monitor}': the {phase} metrics are "
                              f"{', '.join(sorted(metrics)) or 'none'}")
        return metrics[self.metric]


class EarlyStopping(Callback):
    """Stop when the monitored metric has not improved by more than `min_delta` for `patience`
    of its events in a row (Keras' EarlyStopping; an event is a validation, test or display,
    as the monitor's phase says). `best` and `stopped_step` tell what happened."""

    def __init__(self, monitor='validation/loss', patience=0, min_delta=0.0, mode='auto'):
        self.watch = _Watch(monitor, mode)
        if not isinstance(patience, int) or patience < 0:
            raise ConfigError(f"EarlyStopping: patience must be an int >= 0, got {patience!r}")
        self.patience, self.min_delta = patience, abs(float(min_delta))
        self.best, self.wait, self.stopped_step = None, 0, None

    def on_train_begin(self):
        self.best, self.wait, self.stopped_step = None, 0, None

    def on_step_end(self, step, metrics):
        self._event(step, "train", metrics)

    def on_test_end(self, step, phase, metrics):
        self._event(step, phase, metrics)

    def _event(self, step, phase, metrics):
        value = self.watch.value(phase, metrics)
        if value is None:
            return
        delta = self.min_delta if self.watch.lower else -self.min_delta
        if self.best is None or (value < self.best - delta if self.watch.lower
                                 else value > self.best - delta):
            self.best, self.wait = value, 0
            return
        self.wait += 1
        if self.wait > self.patience and self.stopped_step is None:
            self.stopped_step = step
            self.model.stop_training = True


class ModelCheckpoint(Callback):
    """Snapshots ranked by `monitor` (the job's checkpoint_keep_best): with `save_best_only`
    a snapshot when it improves (checkpoint_on_improvement) and only the newest and the best
    `save_top_k` kept; `every` steps a snapshot too (checkpoint_freq). `checkpoint_path='best'`
    then loads the best in evaluate and predict."""
    hears_events = False

    def __init__(self, monitor='validation/loss', save_best_only=False, save_top_k=1,
                 every=None):
        self.monitor = monitor_name(monitor)
        if self.monitor.startswith("train/"):
            raise ConfigError(f"ModelCheckpoint: monitor '{self.monitor}': snapshots are ranked "
                              f"by a test or validation metric")
        if not isinstance(save_top_k, int) or save_top_k < 1:
            raise ConfigError(f"ModelCheckpoint: save_top_k must be an int >= 1, got "
                              f"{save_top_k!r}")
        self.save_best_only, self.save_top_k, self.every = save_best_only, save_top_k, every

    def configure(self, job):
        job.checkpoint_keep_best = self.monitor
        job.checkpoint_keep_best_k = self.save_top_k
        if self.save_best_only:
            job.checkpoint_on_improvement = True
            job.checkpoint_keep_newest = 1
        if self.every is not None:
            job.checkpoint_freq = self.every


class LearningRateScheduler(Callback):
    """The learning rate of each step from `schedule(step)` (a float), written into the job as
    a kFixedStep table of the steps where it changes: it runs in every process of the job and
    a resume continues it exactly."""
    hears_events = False

    def __init__(self, schedule):
        if not callable(schedule):
            raise ConfigError("LearningRateScheduler: schedule must be a function of the step")
        self.schedule = schedule

    def configure(self, job):
        steps, lrs = [], []
        for step in range(job.train_steps):
            lr = self.schedule(step)
            if not isinstance(lr, (int, float)) or not math.isfinite(lr):
                raise ConfigError(f"LearningRateScheduler: schedule({step}) gave {lr!r}, not a "
                                  f"finite number")
            if not lrs or lr != lrs[-1]:
                steps.append(step)
                lrs.append(float(lr))
                if len(steps) > MAX_LR_CHANGES:
                    raise ConfigError(f"LearningRateScheduler: the rate changes more than "
                                      f"{MAX_LR_CHANGES} times; use an Updater's lr_type")
        conf = job.updater.learning_rate
        conf.type = job_pb2.kFixedStep
        conf.base_lr = lrs[0]
        del conf.fixedstep_conf.step[:], conf.fixedstep_conf.step_lr[:]
        conf.fixedstep_conf.step.extend(steps)
        conf.fixedstep_conf.step_lr.extend(lrs)
