"""singa.callbacks: monitors named as Keras names them, Keras' hooks called where fit can call
them (the epoch hooks at each pass's end), and every callback that could never act one
ConfigError line before the job runs."""
import pytest

from singa.callbacks import (Callback, CallbackList, EarlyStopping, LambdaCallback,
                             ModelCheckpoint, monitor_name)
from singa.errors import ConfigError
from singa.proto import job_pb2


class Model:
    stop_training = False


def job(train_steps=30, disp_freq=10, disp_after=9, validate_steps=5, validate_freq=10,
        validate_after=10, test_steps=0, test_freq=0, test_after=0):
    """The JobProto fit plans for 3 passes of 10 steps, validated at each pass's end."""
    return job_pb2.JobProto(
        name="j", train_steps=train_steps, disp_freq=disp_freq, disp_after=disp_after,
        validate_steps=validate_steps, validate_freq=validate_freq,
        validate_after=validate_after, test_steps=test_steps, test_freq=test_freq,
        test_after=test_after, test_at_end=True)


def started(callbacks, j=None, epochs=None, origin=0):
    cbs = CallbackList(callbacks, Model(), epochs, origin)
    cbs.configure(j or job())
    return cbs, cbs.begin()


def test_a_bare_monitor_is_the_train_metric_as_in_keras():
    assert monitor_name("loss") == "train/loss"
    assert monitor_name("accuracy") == "train/accuracy"
    assert monitor_name("val_loss") == "validation/loss"
    assert monitor_name("test_loss") == monitor_name("test/loss") == "test/loss"
    with pytest.raises(ConfigError, match="a bare name is the train metric"):
        ModelCheckpoint("loss")
    with pytest.raises(ConfigError, match="a bare name is the train metric"):
        EarlyStopping("accuracy", restore_best_weights=True)


def test_a_monitor_of_a_phase_the_fit_never_runs_is_refused_naming_what_is_missing():
    bare = job(validate_steps=0, validate_freq=0)
    with pytest.raises(ConfigError, match=r"EarlyStopping: monitor 'validation/loss' needs "
                                          r"validation data: fit\(\.\.\., validation_data"):
        started([EarlyStopping("val_loss")], bare)
    with pytest.raises(ConfigError, match="ModelCheckpoint: monitor 'validation/loss' needs "
                                          "validation data"):
        started([ModelCheckpoint("val_loss")], bare)
    with pytest.raises(ConfigError, match=r"monitor 'test/loss' needs test data: "
                                          r"fit\(\.\.\., with_test=True, test_data"):
        started([EarlyStopping("test/loss")], bare)
    started([EarlyStopping("loss")], bare)     # displays run


def test_epoch_hooks_get_each_pass_s_display_and_end_validation_as_keras_logs():
    seen = []
    cb = LambdaCallback(on_epoch_begin=lambda e, logs: seen.append(("begin", e, logs)),
                        on_epoch_end=lambda e, logs: seen.append(("end", e, logs)),
                        on_batch_end=lambda b, logs: seen.append(("batch", b)))
    cbs, on_event = started([cb], job(test_steps=5, test_freq=10, test_after=10), epochs=3)
    for k in range(3):
        on_event(10 * k + 9, "train", {"loss": k})
        on_event(10 * k + 10, "validation", {"loss": 10 + k})
        on_event(10 * k + 10, "test", {"accuracy": 0.5})
    assert seen[:4] == [("begin", 0, {}), ("batch", 9),
                        ("end", 0, {"loss": 0, "val_loss": 10, "test_accuracy": 0.5}),
                        ("begin", 1, {})]
    assert [s[:2] for s in seen if s[0] != "batch"] == [
        ("begin", 0), ("end", 0), ("begin", 1), ("end", 1), ("begin", 2), ("end", 2)]


def test_a_second_fit_counts_its_epochs_from_its_first_step_and_a_stop_ends_them():
    ends = []
    cb = LambdaCallback(on_epoch_end=lambda e, logs: ends.append((e, logs)) or e == 0)
    cbs, on_event = started([cb], job(train_steps=50, disp_after=39, validate_steps=0,
                                      validate_freq=0), epochs=2, origin=30)
    assert not on_event(35, "train", {"loss": 9})       # not a pass's end
    assert on_event(39, "train", {"loss": 1})
    assert ends == [(0, {"loss": 1})]


def test_hooks_fit_cannot_call_are_one_line_each():
    class Epochs(Callback):
        def on_epoch_end(self, epoch, logs=None):
            pass

    class Before(Callback):
        def on_train_batch_begin(self, batch, logs=None):
            pass
    with pytest.raises(ConfigError, match=r"fit: Epochs.on_epoch_end needs fit\(epochs=\.\.\.\)"):
        CallbackList([Epochs()], Model())
    with pytest.raises(ConfigError, match="on_epoch_begin needs fit"):
        CallbackList([LambdaCallback(on_epoch_begin=print)], Model())
    CallbackList([Epochs()], Model(), epochs=2)
    with pytest.raises(ConfigError, match="Before.on_train_batch_begin is never called: the "
                                          "job reports a step's metrics after it"):
        CallbackList([Before()], Model(), epochs=2)
    with pytest.raises(ConfigError, match="LambdaCallback: on_batch_begin is never called"):
        LambdaCallback(on_batch_begin=print)
    with pytest.raises(ConfigError, match="LambdaCallback: no hook 'on_epoch_ends'; it takes"):
        LambdaCallback(on_epoch_ends=print)


def test_keras_lambda_hooks_and_an_on_batch_end_subclass_are_called():
    seen = []

    class Batches(Callback):
        def on_batch_end(self, batch, logs=None):
            seen.append(("sub", batch, logs))
    cb = LambdaCallback(on_train_begin=lambda logs: seen.append(("begin", logs)),
                        on_train_batch_end=lambda b, logs: seen.append(("lambda", b)),
                        on_train_end=lambda history: seen.append(("end", history)))
    cbs, on_event = started([cb, Batches()])
    on_event(20, "train", {"loss": 1.0})
    cbs.end("history")
    assert seen == [("begin", None), ("lambda", 20), ("sub", 20, {"loss": 1.0}),
                    ("end", "history")]


def test_early_stopping_counts_events_not_better_than_the_baseline_and_says_so(capsys):
    stop = EarlyStopping("val_accuracy", patience=1, baseline=0.9, verbose=1)
    cbs, on_event = started([stop])
    assert not on_event(10, "validation", {"accuracy": 0.5})    # the best, not the baseline
    assert not on_event(20, "validation", {"accuracy": 0.95})   # better than both
    assert not on_event(30, "validation", {"accuracy": 0.9})
    assert on_event(40, "validation", {"accuracy": 0.9})
    assert stop.stopped_step == 40 and (stop.best, stop.best_step) == (0.95, 20)
    assert capsys.readouterr().out == ("EarlyStopping @ step 40: validation/accuracy has not "
                                       "bettered 0.95 (step 20) for 2 of its events: stopping\n")
    early = EarlyStopping("val_accuracy", patience=1, baseline=0.9, verbose=1)
    cbs, on_event = started([early])
    assert not on_event(10, "validation", {"accuracy": 0.5})
    assert on_event(20, "validation", {"accuracy": 0.6}) and early.stopped_step == 20
    assert "has not bettered the baseline 0.9 for 2" in capsys.readouterr().out


def test_callbacks_rank_snapshots_by_one_monitor():
    j = job()
    started([EarlyStopping("val_loss", restore_best_weights=True), ModelCheckpoint("val_loss")],
            j)
    assert j.checkpoint_keep_best == "validation/loss" and j.checkpoint_on_improvement
    with pytest.raises(ConfigError, match="ModelCheckpoint: monitor 'validation/accuracy', but "
                                          "the job's snapshots are ranked by 'validation/loss'"):
        started([EarlyStopping("val_loss", restore_best_weights=True),
                 ModelCheckpoint("val_accuracy")])
