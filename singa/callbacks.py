"""Keras' callbacks over SINGA's machinery, for `Model.fit(..., callbacks=[...])`.

A callback hears the job's events as the metrics reach the launching process: `on_step_end`
and Keras' `on_train_batch_end` at each display of the train metrics (every `disp_freq`
steps), `on_test_end` at each test and validation, and with `fit(epochs=...)` Keras'
`on_epoch_begin` and `on_epoch_end` (a pass's display and the validation and test at its end:
`singa.api.schedule.pass_ends`). Setting `self.model.stop_training = True` there stops the
job after a snapshot a step or two later: in a job of one process the events come from its
worker as they happen (the snapshot is asked for at the next step, which the worker may have
begun); in a job of several they come from its metrics.csv, read every half second, and the
stop is the launcher's SIGUSR1. Callbacks that map onto the job itself write its fields in
`configure` before it runs: ModelCheckpoint (snapshot retention: `checkpoint_keep_best*`),
EarlyStopping's restore_best_weights (a snapshot at each improvement), LearningRateScheduler
(a kFixedStep learning-rate table). A hook fit can never call, or a monitor of a phase the
fit never runs, is a ConfigError before the job starts. Monitors are named as Keras names
them, `val_<metric>` the validation's, `test_<metric>` the test's and a bare `<metric>` the
training's, or "<phase>/<metric>" (phase: train, validation, test); the conf field
`checkpoint_keep_best` keeps SINGA's reading of a bare name, the test's.
"""
import math

from singa import checkpoint
from singa.checkpoint import lower_is_better
from singa.errors import ConfigError
from singa.job.config import parse_monitor
from singa.proto import job_pb2
from singa.train.worker import every

__all__ = ["Callback", "CallbackList", "LambdaCallback", "EarlyStopping", "ModelCheckpoint",
           "LearningRateScheduler", "EpochLines", "StepLines", "monitor_name"]

#: the most learning-rate changes a LearningRateScheduler writes into the job
MAX_LR_CHANGES = 100000
PHASES = ("train", "validation", "test")
#: the prefix of each phase's metrics in Keras' logs (History.history's names)
LOG_PREFIX = {"train": "", "validation": "val_", "test": "test_"}
#: Keras' hooks fit never calls, and why
NEVER_CALLED = dict.fromkeys(
    ("on_batch_begin", "on_train_batch_begin"),
    "the job reports a step's metrics after it, at its displays (on_batch_end)")
NEVER_CALLED.update(dict.fromkeys(
    ("on_test_begin", "on_test_batch_begin", "on_test_batch_end", "on_predict_begin",
     "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end"),
    "fit's callbacks hear training only (on_test_end: each test and validation)"))
#: the hooks that need fit(epochs=...)
EPOCH_HOOKS = ("on_epoch_begin", "on_epoch_end")


def monitor_name(name):
    """"<phase>/<metric>" of a monitor named as Keras names it (a bare name: the train
    metric) or "<phase>/<metric>"."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"monitor must name a metric ('val_loss', 'validation/accuracy', "
                          f"...), got {name!r}")
    phase, sep, metric = name.lower().rpartition("/")
    if not sep:
        for prefix, known in (("val_", "validation"), ("test_", "test"), ("train_", "train")):
            if metric.startswith(prefix):
                return f"{known}/{metric[len(prefix):]}"
        return f"train/{metric}"
    if phase not in PHASES:
        raise ConfigError(f"monitor {name!r}: the phase must be one of {', '.join(PHASES)}")
    return f"{phase}/{metric}"


class Callback:
    """What fit calls; `model` is the Model being fit (set by fit). A subclass overrides the
    hooks it needs: ours, or Keras' that fit can call."""
    model = None

    #: whether the callback hears the job's events (else it only sets fields)
    hears_events = True

    def configure(self, job):
        """Set the fields of the JobProto `job` this callback maps onto, before it runs."""

    def on_train_begin(self, logs=None):
        """Before the job runs (`logs`: None)."""

    def on_epoch_begin(self, epoch, logs=None):
        """fit(epochs=...): before pass `epoch` (0, 1, ... of this fit; `logs` {})."""

    def on_step_end(self, step, metrics):
        """The train metrics ({name: value}) displayed at `step`."""

    def on_train_batch_end(self, batch, logs=None):
        """Keras' name of a display: `batch` the step within its pass (with epochs=, else
        the step), `logs` the train metrics; calls on_batch_end, Keras' older name."""
        self.on_batch_end(batch, logs)

    def on_batch_end(self, batch, logs=None):
        """As on_train_batch_end."""

    def on_test_end(self, step, phase, metrics):
        """The metrics of the test ('test') or validation ('validation') at `step`."""

    def on_epoch_end(self, epoch, logs=None):
        """fit(epochs=...): after pass `epoch`'s validation and test; `logs` its train means
        and `val_`/`test_` metrics, Keras' names."""

    def on_train_end(self, logs=None):
        """After the job; `logs` is its History."""

    def defines(self, hook):
        """Whether the callback does something at Keras' hook `hook` (a method of its own)."""
        return getattr(type(self), hook, None) is not getattr(Callback, hook, None)


class CallbackList:
    """The callbacks of one fit of `model` (Keras' CallbackList): `configure` hands each the
    model and the job's fields, `begin` starts them and gives what the job calls at each event
    (`on_event`; None when none hears events), `end` hands them the History. With `epochs`
    (fit's passes, counted from step `origin`: a second fit's first) it calls the epoch hooks;
    without, a callback that has them is a ConfigError, as is one with a hook never called."""

    def __init__(self, callbacks, model, epochs=None, origin=0):
        self.callbacks, self.model = list(callbacks), model
        self.epochs, self.origin = epochs, origin
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise ConfigError(f"fit: callbacks must be singa.callbacks.Callback objects, got "
                                  f"{type(cb).__name__}")
            for hook, why in NEVER_CALLED.items():
                if cb.defines(hook):
                    raise ConfigError(f"fit: {type(cb).__name__}.{hook} is never called: {why}")
            for hook in EPOCH_HOOKS if epochs is None else ():
                if cb.defines(hook):
                    raise ConfigError(f"fit: {type(cb).__name__}.{hook} needs fit(epochs=...): "
                                      f"nb_epoch counts steps, not passes over the data")

    def configure(self, job):
        for cb in self.callbacks:
            cb.model = self.model
            cb.configure(job)
        self.job = job
        if self.epochs:
            self.per_pass = (job.train_steps - self.origin) // self.epochs

    def begin(self, resumed=None):
        """Start the callbacks of a job that continues from Snapshot `resumed` (None: from
        `origin`); the listener of the job's events, or None."""
        self.model.stop_training = False
        for cb in self.callbacks:
            cb.on_train_begin()
        self.hearing = [cb for cb in self.callbacks if cb.hears_events]
        self.logs = {}
        if self.epochs and self.hearing:
            step = self.origin if resumed is None else resumed.step
            for cb in self.hearing:
                cb.on_epoch_begin((step - self.origin) // self.per_pass, {})
        return self.on_event if self.hearing else None

    def on_event(self, step, phase, metrics):
        """Hand the event to the callbacks that hear events; True once they stop training."""
        for cb in self.hearing:
            if phase == "train":
                cb.on_step_end(step, dict(metrics))
                cb.on_train_batch_end((step - self.origin) % self.per_pass if self.epochs
                                      else step, dict(metrics))
            else:
                cb.on_test_end(step, phase, dict(metrics))
        if self.epochs:
            self.epoch_event(step, phase, metrics)
        return self.model.stop_training

    def epoch_event(self, step, phase, metrics):
        """Keras' epoch hooks: a pass's logs are its display's train metrics (after its last
        step) and those of the validation and test at its end; on_epoch_end once the last of
        them came, then on_epoch_begin of the next pass unless training stops."""
        end = step + 1 if phase == "train" else step
        if (end - self.origin) % self.per_pass:
            return          # not at a pass's end (a display or test every so many steps)
        self.logs.update((LOG_PREFIX[phase] + k, v) for k, v in metrics.items())
        if phase != (self.due_at(end) or ["train"])[-1]:
            return
        epoch = (end - self.origin) // self.per_pass - 1
        logs, self.logs = self.logs, {}
        for cb in self.hearing:
            cb.on_epoch_end(epoch, dict(logs))
        if epoch + 1 < self.epochs and not self.model.stop_training:
            for cb in self.hearing:
                cb.on_epoch_begin(epoch + 1, {})

    def due_at(self, step):
        """The phases that run at `step`, in order: the worker's ValidateNow/TestNow, or at
        train_steps test_at_end's (`singa.train.worker.Worker.evaluate_final`)."""
        job = self.job
        return [name for name, steps, freq, after in (
            ("validation", job.validate_steps, job.validate_freq, job.validate_after),
            ("test", job.test_steps, job.test_freq, job.test_after))
            if steps > 0 and (every(freq, after, step) or (
                step == job.train_steps and job.test_at_end and freq > 0 and step >= after))]

    def end(self, history):
        for cb in self.callbacks:
            cb.on_train_end(history)


class LambdaCallback(Callback):
    """A callback of plain functions, given by keyword: Keras' `on_train_begin(logs)`,
    `on_epoch_begin(epoch, logs)`, `on_batch_end(batch, logs)` (or `on_train_batch_end`),
    `on_epoch_end(epoch, logs)`, `on_train_end(history)`, and ours `on_step_end(step,
    metrics)`, `on_test_end(step, phase, metrics)`. One that returns True stops training (as
    `model.stop_training = True`); a hook fit never calls is refused."""
    HOOKS = ("on_train_begin", "on_epoch_begin", "on_step_end", "on_train_batch_end",
             "on_batch_end", "on_test_end", "on_epoch_end", "on_train_end")

    def __init__(self, **hooks):
        for hook, fn in hooks.items():
            if hook in NEVER_CALLED:
                raise ConfigError(f"LambdaCallback: {hook} is never called: {NEVER_CALLED[hook]}")
            if hook not in self.HOOKS:
                raise ConfigError(f"LambdaCallback: no hook {hook!r}; it takes "
                                  f"{', '.join(self.HOOKS)}")
            if fn is not None and not callable(fn):
                raise ConfigError(f"LambdaCallback: {hook} must be a function, got "
                                  f"{type(fn).__name__}")
        self.fns = {hook: fn for hook, fn in hooks.items() if fn is not None}

    def defines(self, hook):
        return hook in self.fns

    def call(self, hook, *args):
        fn = self.fns.get(hook)
        if fn is not None and fn(*args) is True:
            self.model.stop_training = True

    def on_train_begin(self, logs=None):
        self.call("on_train_begin", logs)

    def on_epoch_begin(self, epoch, logs=None):
        self.call("on_epoch_begin", epoch, logs)

    def on_step_end(self, step, metrics):
        self.call("on_step_end", step, metrics)

    def on_train_batch_end(self, batch, logs=None):
        self.call("on_train_batch_end", batch, logs)
        self.call("on_batch_end", batch, logs)

    def on_test_end(self, step, phase, metrics):
        self.call("on_test_end", step, phase, metrics)

    def on_epoch_end(self, epoch, logs=None):
        self.call("on_epoch_end", epoch, logs)

    def on_train_end(self, logs=None):
        self.call("on_train_end", logs)


class _Watch:
    """The best value of a monitor: lower is better for loss-like metrics ('min'), else
    higher ('max'); `mode` 'auto' chooses by the name, as checkpoint_keep_best does."""

    def __init__(self, monitor, mode):
        self.monitor = monitor_name(monitor)
        self.phase, self.metric = self.monitor.split("/", 1)
        if mode not in ("auto", "min", "max"):
            raise ConfigError(f"mode must be 'auto', 'min' or 'max', got {mode!r}")
        self.lower = lower_is_better(self.metric) if mode == "auto" else mode == "min"

    def check(self, job, who):
        """ConfigError naming what `job` lacks when its monitored phase never runs."""
        steps, freq, needed = {
            "train": (1, job.disp_freq, "displays of the train metrics (disp_freq > 0)"),
            "validation": (job.validate_steps, job.validate_freq,
                           "validation data: fit(..., validation_data=(x, y)) or "
                           "validation_split"),
            "test": (job.test_steps, job.test_freq,
                     "test data: fit(..., with_test=True, test_data=(x, y))")}[self.phase]
        if steps <= 0 or freq <= 0:
            raise ConfigError(f"{who}: monitor '{self.monitor}' needs {needed}, and this fit "
                              f"has none")

    def value(self, phase, metrics):
        """The monitored value among an event's metrics, or None (another phase); a phase
        without the metric is a ConfigError naming what it has."""
        if phase != self.phase:
            return None
        if self.metric not in metrics:
            raise ConfigError(f"monitor '{self.monitor}': the {phase} metrics are "
                              f"{', '.join(sorted(metrics)) or 'none'}")
        return metrics[self.metric]


def _check_ranks(monitor, who):
    """A ConfigError unless `monitor` ("<phase>/<metric>") can rank snapshots: they record
    the tests and validations."""
    if monitor.startswith("train/"):
        raise ConfigError(f"{who}: monitor '{monitor}': snapshots are ranked by a test or "
                          f"validation metric ('val_loss', 'test_accuracy', ...); a bare name "
                          f"is the train metric, as in Keras")


def _rank_snapshots(job, monitor, who):
    """Make `monitor` what ranks `job`'s snapshots (checkpoint_keep_best); the job ranks them
    by one monitor only."""
    if job.checkpoint_keep_best and "/".join(parse_monitor(job.checkpoint_keep_best)) != monitor:
        raise ConfigError(f"{who}: monitor '{monitor}', but the job's snapshots are ranked by "
                          f"'{job.checkpoint_keep_best}' already: give one monitor")
    job.checkpoint_keep_best = monitor


class EarlyStopping(Callback):
    """Stop when the monitored metric has not bettered its best by more than `min_delta`
    (nor, given, the `baseline`) for more than `patience` of its events in a row (Keras'
    EarlyStopping; an event is a validation, test or display, as the monitor's phase says);
    `verbose` prints a line at the stop. `restore_best_weights` (a test or validation monitor):
    a snapshot at each improvement, and after a stop the model's params
    (`last_checkpoint_path`) are those of the best snapshot. `best`, `best_step` and
    `stopped_step` tell what happened."""

    def __init__(self, monitor='validation/loss', patience=0, min_delta=0.0, mode='auto',
                 baseline=None, restore_best_weights=False, verbose=0):
        self.watch = _Watch(monitor, mode)
        if not isinstance(patience, int) or patience < 0:
            raise ConfigError(f"EarlyStopping: patience must be an int >= 0, got {patience!r}")
        if baseline is not None and not (isinstance(baseline, (int, float))
                                         and math.isfinite(baseline)):
            raise ConfigError(f"EarlyStopping: baseline must be a finite number, got "
                              f"{baseline!r}")
        if restore_best_weights:
            _check_ranks(self.watch.monitor, "EarlyStopping(restore_best_weights)")
        self.patience, self.min_delta, self.baseline = patience, abs(float(min_delta)), baseline
        self.restore_best_weights, self.verbose = restore_best_weights, verbose
        self.on_train_begin()

    def configure(self, job):
        self.watch.check(job, "EarlyStopping")
        if self.restore_best_weights:
            _rank_snapshots(job, self.watch.monitor, "EarlyStopping(restore_best_weights)")
            job.checkpoint_on_improvement = True
            self.folder = checkpoint.folder(job.cluster.workspace)

    def on_train_begin(self, logs=None):
        self.best, self.best_step, self.wait, self.stopped_step = None, None, 0, None

    def on_step_end(self, step, metrics):
        self.event(step, "train", metrics)

    def on_test_end(self, step, phase, metrics):
        self.event(step, phase, metrics)

    def better(self, value, than):
        return value < than - self.min_delta if self.watch.lower \
            else value > than + self.min_delta

    def event(self, step, phase, metrics):
        value = self.watch.value(phase, metrics)
        if value is None:
            return
        if self.best is None or self.better(value, self.best):
            self.best, self.best_step = value, step
            if self.baseline is None or self.better(value, self.baseline):
                self.wait = 0
                return
        self.wait += 1
        if self.wait > self.patience and self.stopped_step is None:
            self.stopped_step = step
            self.model.stop_training = True
            if self.verbose:
                than = f"{self.best:.6g} (step {self.best_step})" \
                    if self.baseline is None or self.better(self.best, self.baseline) \
                    else f"the baseline {self.baseline:g}"
                print(f"EarlyStopping @ step {step}: {self.watch.monitor} has not bettered "
                      f"{than} for {self.wait} of its events: stopping")

    def on_train_end(self, logs=None):
        if not self.restore_best_weights or self.stopped_step is None:
            return
        snap = checkpoint.best_snapshot(self.folder, self.watch.monitor)
        if snap is not None:
            self.model.last_checkpoint_path = snap.files[min(snap.files)]
            if self.verbose:
                print(f"EarlyStopping: the model's params are those of step {snap.step}, "
                      f"the best {self.watch.monitor}")


class ModelCheckpoint(Callback):
    """Snapshots ranked by `monitor` (the job's checkpoint_keep_best; a test or validation
    metric): with `save_best_only` a snapshot when it improves (checkpoint_on_improvement)
    and only the newest and the best `save_top_k` kept; `every` steps a snapshot too
    (checkpoint_freq). `checkpoint_path='best'` then loads the best in evaluate and
    predict."""
    hears_events = False

    def __init__(self, monitor='validation/loss', save_best_only=False, save_top_k=1,
                 every=None):
        self.watch = _Watch(monitor, 'auto')
        self.monitor = self.watch.monitor
        _check_ranks(self.monitor, "ModelCheckpoint")
        if not isinstance(save_top_k, int) or save_top_k < 1:
            raise ConfigError(f"ModelCheckpoint: save_top_k must be an int >= 1, got "
                              f"{save_top_k!r}")
        self.save_best_only, self.save_top_k, self.every = save_best_only, save_top_k, every

    def configure(self, job):
        self.watch.check(job, "ModelCheckpoint")
        _rank_snapshots(job, self.monitor, "ModelCheckpoint")
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


class EpochLines(Callback):
    """fit(verbose=2) with epochs: Keras' line per epoch on stdout, "Epoch 2/5 - loss: 0.4121 -
    accuracy: 0.8750 - val_loss: ..."."""

    def __init__(self, epochs):
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs):
        print(f"Epoch {epoch + 1}/{self.epochs} - "
              + " - ".join(f"{k}: {v:.4f}" for k, v in logs.items()), flush=True)


class StepLines(Callback):
    """fit(verbose=2) with nb_epoch (steps): a line per display and per test or validation on
    stdout, "Step 200/1000 - loss: 0.4121 - accuracy: 0.8750"."""

    def configure(self, job):
        self.steps = job.train_steps

    def on_step_end(self, step, metrics):
        self._line(step + 1, "", metrics)

    def on_test_end(self, step, phase, metrics):
        self._line(step, LOG_PREFIX[phase], metrics)

    def _line(self, step, prefix, metrics):
        print(f"Step {step}/{self.steps} - "
              + " - ".join(f"{prefix}{k}: {v:.4f}" for k, v in metrics.items()), flush=True)
