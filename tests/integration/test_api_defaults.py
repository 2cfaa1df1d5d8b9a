"""The Python API's defaults give the right numbers or one clear line: evaluate scores every
sample once, fit validates and tests its final params, a second fit continues, labels and
losses are checked, and Keras' spellings mean what Keras means."""
import json
import os
import pickle
import re
import shutil
import subprocess
import textwrap

import numpy as np
import pytest

import singa
from conftest import FIXTURES, PYTHON, scaled_records
from singa import checkpoint
from singa.api import session
from singa.callbacks import (EarlyStopping, LambdaCallback, LearningRateScheduler,
                             ModelCheckpoint)
from singa.errors import CheckpointError, ConfigError, DataError
from singa.io import write_records
from singa.io.kvfile import KVFile
from singa.io.records import decode_batch
from singa.job import config
from singa.model import (SGD, Adam, Cluster, Convolution2D, Data, Dense, Model, Parameter,
                         RMSProp, Sequential, load_model)

FLT_MIN = np.finfo(np.float32).tiny



@pytest.fixture(scope="module")
def train():
    return scaled_records(os.path.join(FIXTURES, "train-1000.bin"))


@pytest.fixture(scope="module")
def test():
    return scaled_records(os.path.join(FIXTURES, "test-500.bin"))


def mlp(workspace, optimizer=None, loss='categorical_crossentropy'):
    m = Sequential('mlp')
    m.add(Dense(16, init='uniform', activation='tanh'))
    m.add(Dense(10, init='uniform', activation='softmax'))
    m.compile(loss=loss, optimizer=optimizer or SGD(lr=0.05, momentum=0.9),
              cluster=Cluster(str(workspace)))
    return m


def params(path):
    r = checkpoint.CheckpointReader(str(path))
    return {name: r.param(name).tobytes() for name in r.names}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, train):
    m = mlp(tmp_path_factory.mktemp("trained") / "ws")
    m.fit(*train, nb_epoch=30, batch_size=50, seed=3, progress=False)
    return m


def hand_count(m, x, y):
    """Loss and accuracy of every sample, from predict's probabilities."""
    p = m.predict(x).astype(np.float64)
    loss = -np.log(np.maximum(p[np.arange(len(y)), y], FLT_MIN)).mean()
    return loss, float(np.mean(np.argmax(p, axis=1) == y))


@pytest.mark.parametrize("n", [2000, 300, 50])
def test_evaluate_scores_every_sample_once_as_a_hand_count(trained, train, test, n):
    """2000 samples (31 batches of 64 and one of 16), 300 (4 and one of 44), 50 (fewer than a
    batch): the mean over exactly those samples."""
    x = np.concatenate([train[0], test[0], train[0]])[:n]
    y = np.concatenate([train[1], test[1], train[1]])[:n]
    loss, accuracy = hand_count(trained, x, y)
    got = trained.evaluate(x, y, verbose=0)
    assert got["accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert got["loss"] == pytest.approx(loss, rel=1e-5)


def test_evaluate_prints_one_result_line_unless_verbose_0(trained, test, capsys):
    trained.evaluate(*test)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("Test @ step 30 on 500 samples:  loss = ")
    trained.evaluate(*test, verbose=0)
    assert capsys.readouterr().out == ""


def test_explicit_test_steps_keep_singa_meaning(trained, test):
    """test_steps batches, wrapping around: 2 batches of 64 are the first 128 samples."""
    x, y = test
    assert trained.evaluate(x, y, test_steps=2, verbose=0) == \
        pytest.approx(trained.evaluate(x[:128], y[:128], verbose=0), rel=1e-6)


def test_fit_validates_and_tests_its_final_params_over_all_the_data(tmp_path, train, test):
    m = mlp(tmp_path / "ws")
    h = m.fit(*train, nb_epoch=20, batch_size=50, validation_data=test, with_test=True,
              test_data=test, seed=1, progress=False)
    assert [s for s, _ in h["validation"]] == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    assert h["test"][-1][0] == 20 and h.snapshots[-1][0] == 20
    final = m.evaluate(*test, verbose=0)
    for phase in ("validation", "test"):
        assert h.last(phase) == pytest.approx(final, rel=1e-5)
    assert h.history["val_loss"] == [v["loss"] for _, v in h["validation"]]


def test_validation_split_holds_out_the_last_samples(tmp_path, train):
    x, y = train
    h = mlp(tmp_path / "ws").fit(x, y, nb_epoch=10, validation_split=0.2, seed=1,
                                 progress=False)
    m = mlp(tmp_path / "ws2")
    h2 = m.fit(x[:800], y[:800], nb_epoch=10, validation_data=(x[800:], y[800:]), seed=1,
               progress=False)
    assert h["validation"] == h2["validation"]


def test_epochs_are_passes_over_numpy_data(tmp_path, train):
    h = mlp(tmp_path / "ws").fit(*train, epochs=2, batch_size=100, seed=1, progress=False)
    assert h.snapshots[-1][0] == 20 and [s for s, _ in h["train"]] == [9, 19]


def test_epochs_log_each_pass_s_train_mean_and_its_end_s_validation(tmp_path, train, test):
    """History.history with epochs= is Keras': per pass the mean of its steps' train metrics
    (the steps' own losses: a run displaying every step) and the validation of the params at
    its end, aligned; a second fit logs its own passes alike."""
    m = mlp(tmp_path / "a")
    h = m.fit(*train, epochs=3, batch_size=100, validation_data=test, seed=1, progress=False)
    each = mlp(tmp_path / "b").fit(*train, epochs=3, batch_size=100, validation_data=test,
                                   disp_freq=1, seed=1, progress=False)
    losses = [v["loss"] for _, v in each["train"]]
    assert len(losses) == 30
    assert h.history["loss"] == pytest.approx([np.mean(losses[k:k + 10])
                                               for k in (0, 10, 20)], rel=1e-9)
    assert [s for s, _ in h["train"]] == [9, 19, 29]
    assert [s for s, _ in h["validation"]] == [10, 20, 30]
    assert h.history["val_loss"] == each.history["val_loss"]
    assert h.history["val_loss"][-1] == pytest.approx(m.evaluate(*test, verbose=0)["loss"],
                                                      rel=1e-6)
    again = m.fit(*train, epochs=2, batch_size=100, validation_data=test, seed=1,
                  progress=False)
    assert [s for s, _ in again["train"]] == [39, 49]
    assert [s for s, _ in again["validation"]] == [40, 50]


def test_a_second_fit_continues_from_the_params_the_first_left(tmp_path, train):
    a = mlp(tmp_path / "a")
    a.fit(*train, nb_epoch=20, batch_size=50, seed=5, progress=False)
    h = a.fit(*train, nb_epoch=20, batch_size=50, seed=5, progress=False)
    assert h.snapshots[-1][0] == 40
    b = mlp(tmp_path / "b")
    b.fit(*train, nb_epoch=40, batch_size=50, seed=5, progress=False)
    assert params(a.last_checkpoint_path) == params(b.last_checkpoint_path)
    with pytest.raises(ConfigError, match="at step 40, and nb_epoch 40 .* leaves nothing"):
        a.fit(*train, nb_epoch=40, batch_size=50, resume=True, progress=False)


def test_fit_without_labels_or_without_a_loss_is_one_line(tmp_path, train):
    with pytest.raises(ConfigError, match="layer '.*' compares the outputs with labels: give y"):
        mlp(tmp_path / "ws").fit(train[0], nb_epoch=5, progress=False)
    m = Sequential('noloss')
    m.add(Dense(10, init='uniform'))
    m.compile(optimizer=SGD(), cluster=Cluster(str(tmp_path / "ws2")))
    with pytest.raises(ConfigError, match="has no loss layer"):
        m.fit(*train, nb_epoch=5, progress=False)


def test_one_hot_labels_train_as_class_indices_and_strings_are_refused(tmp_path, train):
    x, y = train
    a = mlp(tmp_path / "a")
    a.fit(x, np.eye(10, dtype=np.float32)[y], nb_epoch=10, seed=2, progress=False)
    b = mlp(tmp_path / "b")
    b.fit(x, y, nb_epoch=10, seed=2, progress=False)
    assert params(a.last_checkpoint_path) == params(b.last_checkpoint_path)
    with pytest.raises(ConfigError, match="labels y must be class indices .* got dtype <U"):
        b.evaluate(x, y.astype(str))
    with pytest.raises(ConfigError, match="3 labels for 1000 samples"):
        b.evaluate(x, y[:3])


def test_compile_takes_keras_names_and_refuses_what_it_cannot_do(tmp_path, train):
    m = mlp(tmp_path / "ws", optimizer='adam', loss='sparse_categorical_crossentropy')
    assert m.jobconf.updater.type == Adam().proto.type
    h = m.fit(*train, nb_epoch=20, seed=1, progress=False)
    assert h["train"][-1][1]["loss"] < h["train"][0][1]["loss"]
    assert RMSProp(rho=0.8).proto.rmsprop_conf.rho == pytest.approx(0.8)
    with pytest.raises(ConfigError, match="optimizer 'sgdd' is not known"):
        mlp(tmp_path / "ws", optimizer='sgdd')
    with pytest.raises(ConfigError, match="metric 'accuracy' is not computed"):
        Sequential('m').compile(optimizer='sgd', cluster=Cluster(str(tmp_path)),
                                loss='mse', metrics=['accuracy'])
    with pytest.raises(TypeError, match="metric"):
        Sequential('m').compile(optimizer='sgd', cluster=Cluster(str(tmp_path)), metric=['acc'])


def test_history_names_its_phases_and_gives_keras_names(tmp_path, train):
    h = mlp(tmp_path / "ws").fit(*train, nb_epoch=4, validation_data=train, seed=1,
                                 progress=False)
    with pytest.raises(KeyError, match="History.history"):
        h["val_loss"]
    assert set(h.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}


def test_channels_last_images_are_refused_with_the_layout(tmp_path):
    m = Sequential('conv')
    m.add(Convolution2D(4, kernel=3, activation='relu'))
    m.add(Dense(10, activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer='sgd', cluster=Cluster(str(tmp_path)))
    x = np.zeros((8, 28, 28, 1), np.float32)
    with pytest.raises(ConfigError, match=r"images are \(N, C, H, W\).*transpose\(0, 3, 1, 2\)"):
        m.fit(x, np.zeros(8, int), nb_epoch=1, progress=False)


def test_predict_of_one_sample_says_how_to_give_a_batch(trained, test):
    with pytest.raises(ConfigError, match=r"is one sample; give a batch of one, x\[None\]"):
        trained.predict(test[0][0])


def test_best_by_a_validation_monitor_loads(tmp_path, train, test):
    m = mlp(tmp_path / "ws")
    m.fit(*train, nb_epoch=20, validation_data=test, checkpoint_freq=5, seed=1, progress=False)
    assert set(m.evaluate(*test, checkpoint_path='best', verbose=0)) == {"loss", "accuracy"}


def test_loaded_params_are_reported_and_a_file_of_other_names_is_an_error(tmp_path, train,
                                                                         trained, capfd):
    m = mlp(tmp_path / "ws")
    m.fit(*train, nb_epoch=2, checkpoint_path=trained.last_checkpoint_path, progress=False)
    assert f"singa: Loaded 4 of 4 params from {trained.last_checkpoint_path}" in \
        capfd.readouterr().err
    other = Sequential('other')
    for i, (dim, act) in enumerate(((16, 'tanh'), (10, 'softmax'))):
        other.add(Dense(dim, activation=act, w_param=Parameter(name=f'fc{i}w', init='uniform'),
                        b_param=Parameter(name=f'fc{i}b', init='constant')))
    other.compile(loss='categorical_crossentropy', optimizer='sgd',
                  cluster=Cluster(str(tmp_path / "ws2")))
    with pytest.raises(CheckpointError, match="none of the net's 4 params .* the names differ"):
        other.fit(*train, nb_epoch=2, checkpoint_path=trained.last_checkpoint_path,
                  progress=False)


def test_a_model_pickles(trained):
    again = pickle.loads(pickle.dumps(trained))
    assert again.jobconf == trained.jobconf and again.last_checkpoint_path == \
        trained.last_checkpoint_path


def test_to_conf_writes_absolute_paths_and_numpy_data_beside_the_conf(tmp_path, train,
                                                                     monkeypatch):
    """The conf runs from any folder: singa-run.sh resolves relative paths against the SINGA
    home, not where the script ran; numpy data become a kvfile of the same records."""
    monkeypatch.chdir(tmp_path)
    x, y = train
    m = mlp("ws")
    m.fit(x, y, nb_epoch=2, progress=False)
    with pytest.raises(ConfigError, match="reads numpy data, .* give a path"):
        m.to_conf()
    (tmp_path / "out").mkdir()
    text = m.to_conf("out/job.conf")
    job = config.load_job(str(tmp_path / "out" / "job.conf"))
    assert text == (tmp_path / "out" / "job.conf").read_text()
    assert job.cluster.workspace == str(tmp_path / "ws")
    (data,) = [ly for ly in job.neuralnet.layer if ly.store_conf.path]
    assert data.store_conf.backend == "kvfile"
    assert data.store_conf.path == str(tmp_path / "out" / f"job-{data.name}-train.bin")
    with KVFile(data.store_conf.path) as f:
        got_x, got_y = decode_batch([v for _, v in f], 784)
    assert np.array_equal(got_x, x) and np.array_equal(got_y, y)
    job.train_steps, job.cluster.workspace = 3, str(tmp_path / "ws2")
    h = session.train(session.prepare(job), progress=False)
    assert h.snapshots[-1][0] == 3


def test_write_records_writes_chunks_as_one_kvfile_whole_or_not_at_all(tmp_path, train):
    x, y = train
    path = tmp_path / "data.bin"
    chunks = ((x[i:i + 300], np.eye(10)[y[i:i + 300]]) for i in range(0, len(x), 300))
    assert write_records(str(path), chunks) == len(x)
    with KVFile(str(path)) as f:
        pairs = list(f)
    assert [k for k, _ in pairs] == [b"%05d" % i for i in range(len(x))]
    got_x, got_y = decode_batch([v for _, v in pairs], 784)
    assert np.array_equal(got_x, x) and np.array_equal(got_y, y)

    def bad():
        yield x[:10], y[:10]
        yield x[:10], y[:3]
    with pytest.raises(ConfigError, match="3 labels for 10 samples"):
        write_records(str(tmp_path / "bad.bin"), bad())
    assert sorted(os.listdir(tmp_path)) == ["data.bin"]


# --- callbacks -----------------------------------------------------------------------------

def test_early_stopping_stops_after_patience_with_a_snapshot_that_resumes(tmp_path, train,
                                                                         test):
    """min_delta 10 never counts as better: validations at 0 (the best), 5, 10 (patience 1
    used up): the job stops a step or two after 10, after a snapshot."""
    stop = EarlyStopping(monitor='val_loss', patience=1, min_delta=10)
    m = mlp(tmp_path / "ws")
    h = m.fit(*train, nb_epoch=200, validation_data=test, validate_freq=5, callbacks=[stop],
              seed=1, progress=False)
    assert stop.stopped_step == 10 and 10 <= h.snapshots[-1][0] <= 13
    assert [s for s, _ in h["validation"]] == [0, 5, 10]
    again = m.fit(*train, nb_epoch=5, validation_data=test, validate_freq=5, seed=1,
                  progress=False)
    assert again.snapshots[-1][0] == h.snapshots[-1][0] + 5


def test_a_lambda_callback_sees_every_event_and_can_stop(tmp_path, train, test):
    seen = []
    cb = LambdaCallback(on_step_end=lambda step, metrics: seen.append(("train", step)),
                        on_test_end=lambda step, phase, metrics:
                        seen.append((phase, step)) or step >= 20)
    h = mlp(tmp_path / "ws").fit(*train, nb_epoch=100, disp_freq=10, with_test=True,
                                 test_data=test, test_freq=10, callbacks=[cb], seed=1,
                                 progress=False)
    assert seen[:5] == [("test", 0), ("train", 0), ("test", 10), ("train", 10), ("test", 20)]
    assert 20 <= h.snapshots[-1][0] <= 23


def test_model_checkpoint_keeps_the_best_and_best_loads_it(tmp_path, train, test):
    m = mlp(tmp_path / "ws", optimizer=SGD(lr=0.5, momentum=0.9))
    h = m.fit(*train, nb_epoch=40, validation_data=test, validate_freq=4, seed=4,
              callbacks=[ModelCheckpoint('val_accuracy', save_best_only=True, save_top_k=2)],
              progress=False)
    kept = checkpoint.list_snapshots(str(tmp_path / "ws" / "checkpoint"))
    assert len(kept) <= 3
    best = max(v["accuracy"] for _, v in h["validation"])
    assert m.evaluate(*test, checkpoint_path='best', verbose=0)["accuracy"] == \
        pytest.approx(best, abs=1e-12)


def test_keras_epoch_hooks_see_what_the_history_logs_per_epoch(tmp_path, train, test):
    logs = []
    cb = LambdaCallback(on_epoch_end=lambda epoch, values: logs.append((epoch, values)))
    h = mlp(tmp_path / "ws").fit(*train, epochs=3, batch_size=100, validation_data=test,
                                 callbacks=[cb], seed=1, progress=False)
    assert [e for e, _ in logs] == [0, 1, 2]
    for name in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert [v[name] for _, v in logs] == h.history[name]
    with pytest.raises(ConfigError, match=r"LambdaCallback.on_epoch_end needs fit\(epochs="):
        mlp(tmp_path / "b").fit(*train, nb_epoch=10, callbacks=[cb], progress=False)


def test_callbacks_that_could_never_act_are_one_line_before_training(tmp_path, train, test):
    m = mlp(tmp_path / "ws")
    for cb in (EarlyStopping('val_loss'), ModelCheckpoint('val_accuracy')):
        with pytest.raises(ConfigError, match=f"{type(cb).__name__}: monitor "
                                              f"'validation/.*' needs validation data"):
            m.fit(*train, nb_epoch=10, callbacks=[cb], progress=False)
    with pytest.raises(ConfigError, match="monitor 'test/loss' needs test data"):
        m.fit(*train, nb_epoch=10, validation_data=test, callbacks=[EarlyStopping('test_loss')],
              progress=False)
    assert not os.path.exists(tmp_path / "ws" / "checkpoint")
    m.fit(*train, nb_epoch=10, seed=1, progress=False)
    for run in (lambda: m.evaluate(*test, checkpoint_path='best'),
                lambda: m.predict(test[0], checkpoint_path='best')):
        with pytest.raises(CheckpointError, match='"best": no complete snapshot recording a '
                                                  'test or validation metric'):
            run()


def test_early_stopping_restores_the_params_of_its_best_validation(tmp_path, train, test):
    """lr 0.5: the validation loss is best at step 20, worse at 30 and 40 (patience 1 used
    up): after the stop the model's params are step 20's snapshot, which predict, evaluate,
    save and a further fit use."""
    stop = EarlyStopping('val_loss', patience=1, restore_best_weights=True)
    m = mlp(tmp_path / "ws", optimizer=SGD(lr=0.5, momentum=0.9))
    h = m.fit(*train, epochs=10, batch_size=100, validation_data=test, callbacks=[stop],
              seed=1, progress=False)
    best = min(v["loss"] for _, v in h["validation"])
    assert (stop.best_step, stop.stopped_step) == (20, 40) and stop.best == best
    assert h.snapshots[-1][0] > 40
    assert checkpoint.parse_step_worker(os.path.basename(m.last_checkpoint_path)) == (20, 0)
    assert m.evaluate(*test, verbose=0)["loss"] == pytest.approx(best, rel=1e-6)
    assert m.evaluate(*test, checkpoint_path='best', verbose=0)["loss"] == \
        pytest.approx(best, rel=1e-6)
    again = m.fit(*train, epochs=1, batch_size=100, progress=False)   # Keras': from the best
    assert [s for s, _ in again["train"]] == [29] and again.snapshots[-1][0] == 30


def test_a_learning_rate_schedule_is_the_job_s_fixed_step_table(tmp_path, train):
    a = mlp(tmp_path / "a")
    a.fit(*train, nb_epoch=20, seed=6, progress=False,
          callbacks=[LearningRateScheduler(lambda step: 0.1 if step < 10 else 0.01)])
    b = mlp(tmp_path / "b", optimizer=SGD(momentum=0.9, lr_type='manual', step=(0, 10),
                                          step_lr=(0.1, 0.01)))
    b.fit(*train, nb_epoch=20, seed=6, progress=False)
    assert params(a.last_checkpoint_path) == params(b.last_checkpoint_path)
    c = mlp(tmp_path / "c", optimizer=SGD(lr=lambda step: 0.1 if step < 10 else 0.01,
                                          momentum=0.9))
    c.fit(*train, nb_epoch=20, seed=6, progress=False)
    assert params(c.last_checkpoint_path) == params(b.last_checkpoint_path)
    with pytest.raises(ConfigError, match=r"schedule\(3\) gave nan"):
        a.fit(*train, nb_epoch=5, progress=False,
              callbacks=[LearningRateScheduler(lambda step: float('nan') if step == 3 else 1)])


# --- save, load and confs ------------------------------------------------------------------

def test_a_saved_model_predicts_and_evaluates_in_a_new_process(tmp_path, train, test):
    """save writes the conf, the params and the preprocessing; a process that builds nothing
    gets the same outputs and metrics."""
    x, y = train
    m = Sequential('scaled')
    m.add(Data(x=(x * 255).astype(np.uint8), y=y, batch_size=50, mean_value=127.5,
               std_value=127.5))
    m.add(Dense(16, init='uniform', activation='tanh'))
    m.add(Dense(10, init='uniform', activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer='sgd',
              cluster=Cluster(str(tmp_path / "ws")))
    m.fit(nb_epoch=20, seed=2, progress=False)
    tx = (test[0] * 255).astype(np.uint8)
    m.save(str(tmp_path / "saved"))
    np.save(tmp_path / "x.npy", tx)
    np.save(tmp_path / "y.npy", test[1])
    script = textwrap.dedent(f"""
        import json, numpy as np
        from singa.model import load_model
        m = load_model({str(tmp_path / "saved")!r})
        x, y = np.load({str(tmp_path / "x.npy")!r}), np.load({str(tmp_path / "y.npy")!r})
        np.save({str(tmp_path / "p.npy")!r}, m.predict(x))
        print(json.dumps(m.evaluate(x, y, verbose=0)))
        """)
    r = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env=dict(os.environ, PYTHONPATH=singa.HOME))
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.load(tmp_path / "p.npy"), m.predict(tx))
    here = m.evaluate(tx, test[1], verbose=0)    # x preprocessed as the model's data layer
    assert here["accuracy"] == np.mean(np.argmax(m.predict(tx), axis=1) == test[1])
    assert json.loads(r.stdout) == pytest.approx(here, rel=1e-6)
    loaded = load_model(str(tmp_path / "saved"))        # batches through the saved layer too
    assert loaded.evaluate(iter([(tx[:300], test[1][:300]), (tx[300:], test[1][300:])]),
                           verbose=0) == pytest.approx(here, rel=1e-6)


def test_a_failed_save_keeps_the_earlier_model_and_leaves_no_new_folder(tmp_path, trained,
                                                                        train, test,
                                                                        monkeypatch):
    """A save that fails part way (a full disk) over an earlier model leaves that model whole
    (load_model predicts as before); into a new folder it leaves no folder; a save that
    succeeds replaces the earlier model's files."""
    folder = tmp_path / "saved"
    trained.save(str(folder))
    before = load_model(str(folder)).predict(test[0])
    other = mlp(tmp_path / "other")
    other.fit(*train, nb_epoch=7, batch_size=50, seed=4, progress=False)
    real, calls = singa.files.copy_atomic, []

    def full_disk(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", dst)
        return real(src, dst)
    monkeypatch.setattr(singa.files, "copy_atomic", full_disk)
    with pytest.raises(ConfigError, match="No space left on device"):
        other.save(str(folder))
    assert np.array_equal(load_model(str(folder)).predict(test[0]), before)
    # (load_model's workspace is the folder's own)
    assert sorted(os.listdir(folder)) == ["job.conf", "step30-worker0.bin",
                                          "step30-worker0.meta", "workspace"]
    calls.clear()
    with pytest.raises(ConfigError, match="No space left on device"):
        other.save(str(tmp_path / "new"))
    assert not (tmp_path / "new").exists()
    monkeypatch.setattr(singa.files, "copy_atomic", real)
    other.save(str(folder))
    assert sorted(os.listdir(folder)) == ["job.conf", "step7-worker0.bin",
                                          "step7-worker0.meta", "workspace"]
    assert np.array_equal(load_model(str(folder)).predict(test[0]), other.predict(test[0]))


def test_a_loaded_model_fits_on_from_its_step_and_optimizer_state(tmp_path, train):
    """Keras' load_model restores the optimizer: the loaded model's fit continues at the saved
    step, bit-exactly as the saved model's own next fit (on data read from their start), and
    its callbacks and History hear the train metrics."""
    x, y = train
    m = mlp(tmp_path / "ws", optimizer=SGD(lr=0.05, momentum=0.9))
    m.fit(x, y, nb_epoch=12, batch_size=50, seed=5, progress=False)
    m.save(str(tmp_path / "saved"))
    heard = []
    loaded = load_model(str(tmp_path / "saved"))
    h = loaded.fit(x, y, nb_epoch=10, batch_size=50, disp_freq=5, progress=False,
                   callbacks=[LambdaCallback(on_step_end=lambda step, _: heard.append(step))])
    assert heard == [12, 17] and [s for s, _ in h["train"]] == [12, 17]
    assert h.snapshots[-1][0] == 22
    m.fit(x.copy(), y, nb_epoch=10, batch_size=50, progress=False)   # other data: from start
    assert params(loaded.last_checkpoint_path) == params(m.last_checkpoint_path)


def test_a_conf_made_for_testing_predicts_with_its_checkpoint_path(tmp_path, trained, test):
    """As singa-import.sh prints: Model.from_conf(job.conf).predict(x) loads the conf's
    checkpoint_path and reads x, not the conf's data file (gone here)."""
    text = trained.jobconf.__class__()
    text.CopyFrom(trained.jobconf)
    text.neuralnet.CopyFrom(trained.build())
    for ly in text.neuralnet.layer:
        if ly.store_conf.path:
            ly.store_conf.backend, ly.store_conf.path = "kvfile", str(tmp_path / "gone.bin")
    text.checkpoint_path.append(trained.last_checkpoint_path)
    text.cluster.workspace = str(tmp_path / "ws")
    (tmp_path / "job.conf").write_text(str(text))
    m = Model.from_conf(str(tmp_path / "job.conf"))
    assert np.array_equal(m.predict(test[0]), trained.predict(test[0]))
    assert m.evaluate(*test, verbose=0) == pytest.approx(trained.evaluate(*test, verbose=0),
                                                         rel=1e-6)


def test_iterables_of_batches_train_evaluate_and_predict_as_the_arrays_do(tmp_path, train,
                                                                         test):
    """Batches streamed through a kvfile in the workspace: the same losses, params, metrics
    and outputs as the arrays they come from."""
    def batches(x, y, k=128):
        return ((x[i:i + k], y[i:i + k]) for i in range(0, len(x), k))
    a, b = mlp(tmp_path / "a"), mlp(tmp_path / "b")
    ha = a.fit(batches(*train), epochs=2, validation_data=batches(*test), seed=3,
               progress=False)
    hb = b.fit(*train, epochs=2, validation_data=test, batch_size=128, seed=3,
               progress=False)      # an iterable's batch is its own (Keras')
    assert ha["train"] == hb["train"] and ha["validation"] == hb["validation"]
    assert params(a.last_checkpoint_path) == params(b.last_checkpoint_path)
    assert os.path.isfile(tmp_path / "a" / "data" / "train-stream.bin")
    assert a.evaluate(batches(*test), verbose=0) == b.evaluate(*test, batch_size=128,
                                                               verbose=0)
    assert np.array_equal(a.predict(x for x, _ in batches(*test)),
                          np.concatenate([b.predict(x) for x, _ in batches(*test)]))
    assert not open_files(tmp_path / "a"), "the stream files stay open"


def test_an_endless_generator_gives_steps_per_epoch_batches_to_each_epoch(tmp_path, train,
                                                                          test):
    """Keras' `while True: yield` generator: fit pulls steps_per_epoch batches for each epoch
    and no more (each epoch its own batches, so per-epoch augmentation stays), and
    validation_steps batches of validation; a generator that ends too soon is one line."""
    pulled = {"train": 0, "val": 0}

    def endless(x, y, key, k=50):
        while True:
            for i in range(0, len(x), k):
                pulled[key] += 1
                yield x[i:i + k] + np.float32(pulled[key] // 7), y[i:i + k]
    m = mlp(tmp_path / "ws")
    h = m.fit(endless(*train, "train"), epochs=3, steps_per_epoch=7,
              validation_data=endless(*test, "val"), validation_steps=2, seed=1,
              progress=False)
    assert pulled == {"train": 21, "val": 2}
    assert h.snapshots[-1][0] == 21
    records = KVFile(str(tmp_path / "ws" / "data" / "train-stream.bin")).read_many(10**4)
    assert len(records) == 21 * 50
    x = decode_batch([v for _, v in records], 784)[0]
    assert [round(float(x[j * 350:(j + 1) * 350].max() - x[:350].max()), 4)
            for j in range(3)] == [0, 1, 2]     # each epoch its own (augmented) batches
    assert [s for s, _ in h["validation"]][-1] == 21
    with pytest.raises(ConfigError, match=r"ended after 3 batches, and 10 are asked for"):
        m.fit(iter([train] * 3), steps_per_epoch=10, progress=False)


def test_an_endless_generator_without_a_bound_is_refused_before_the_disk_fills(
        tmp_path, train, monkeypatch):
    from singa.api import feed
    free = shutil.disk_usage(tmp_path).free
    monkeypatch.setattr(feed, "STREAM_RESERVE", free - (8 << 20))   # 8 MiB to fill

    def endless(x, y):
        while True:
            yield x[:100], y[:100]
    with pytest.raises(ConfigError, match=r"has not ended after \d+ batches .* an endless "
                                          r"generator\? give steps_per_epoch"):
        mlp(tmp_path / "ws").fit(endless(*train), epochs=1, progress=False)
    assert not list((tmp_path / "ws" / "data").iterdir())   # no half-written stream


def test_samples_that_are_not_finite_are_refused_in_evaluate_and_validation(tmp_path,
                                                                             trained, train,
                                                                             test):
    """NaN samples would score as class 0 (accuracy 1.0 on all-NaN input): refused as fit
    refuses them, naming the sample."""
    x = test[0].copy()
    x[3, 5] = np.nan
    with pytest.raises(ConfigError, match=r"^evaluate: sample 3 of x is not finite"):
        trained.evaluate(x, test[1], verbose=0)
    later = test[0].copy()
    later[103, 0] = np.nan
    with pytest.raises(ConfigError, match=r"^evaluate: sample 103 of x is not finite"):
        trained.evaluate(iter([(later[:100], test[1][:100]), (later[100:], test[1][100:])]),
                         verbose=0)
    with pytest.raises(ConfigError, match=r"^fit: validation_data: sample 3 of x is not"):
        mlp(tmp_path / "ws").fit(*train, nb_epoch=5, validation_data=(x, test[1]),
                                 progress=False)
    x[:] = np.inf
    with pytest.raises(ConfigError, match=r"^fit: sample 0 of x is not finite"):
        mlp(tmp_path / "ws").fit(x, test[1], nb_epoch=5, progress=False)


def open_files(folder):
    """The files under `folder` this process holds open."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:     # closed while listed
            continue
        if target.startswith(str(folder) + os.sep):
            out.append(target)
    return out


def test_a_worker_error_is_raised_once_and_not_printed_too(tmp_path, train, capfd):
    x, y = train
    m = mlp(tmp_path / "ws")
    with pytest.raises(DataError, match="label 12 .* is outside \\[0, 10\\)"):
        m.fit(x, np.full(len(y), 12), nb_epoch=5, progress=False)
    assert "label 12" not in capfd.readouterr().err


def test_a_continued_fit_s_progress_bar_starts_at_the_resumed_step(tmp_path, train, capfd):
    m = mlp(tmp_path / "ws")
    m.fit(*train, nb_epoch=20, progress=False)
    m.fit(*train, nb_epoch=20)
    states = re.findall(r"(\d+)/40 \[", capfd.readouterr().err)
    assert states[0] == "20" and states[-1] == "40", states


def test_a_second_fit_on_other_data_reads_them_from_their_start(tmp_path, train, test):
    """Params and updater go on; the new data's first batch is read at the first step (the
    snapshot's reader position belonged to the data of the first fit)."""
    m = mlp(tmp_path / "ws")
    m.fit(*train, nb_epoch=20, batch_size=50, seed=1, progress=False)
    x, y = test[0][:100], test[1][:100]
    loss, _ = hand_count(m, x[:50], y[:50])        # the params of step 20
    h = m.fit(x, y, nb_epoch=10, batch_size=50, disp_freq=10, seed=1, progress=False)
    assert h["train"][0][0] == 20
    assert h["train"][0][1]["loss"] == pytest.approx(loss, rel=1e-5)
    again = m.fit(iter([(x, y)]), nb_epoch=10, batch_size=50, disp_freq=10, progress=False)
    assert again.snapshots[-1][0] == 40


def test_fit_verbose_as_keras_0_silent_1_bar_2_a_line_per_epoch(tmp_path, train, capfd):
    x, y = train
    m = mlp(tmp_path / "ws")
    m.fit(x, y, epochs=2, batch_size=100, validation_split=0.2, verbose=2)
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert [line.split(" - ")[0] for line in lines] == ["Epoch 1/2", "Epoch 2/2"], out
    assert all(re.fullmatch(r"Epoch \d/2 - loss: [\d.]+ - accuracy: [\d.]+ - val_loss: "
                            r"[\d.]+ - val_accuracy: [\d.]+", line) for line in lines), out
    assert "it/s" not in err and "step/s" not in err     # no bar
    m.fit(x, y, epochs=1, batch_size=100, verbose=0)
    assert capfd.readouterr() == ("", "")
    with pytest.raises(ConfigError, match="verbose must be 0 .* got 3"):
        m.fit(x, y, epochs=1, verbose=3)
    with pytest.raises(ConfigError, match="class_weight .* has no SINGA meaning"):
        m.fit(x, y, epochs=1, class_weight={0: 2.0})


def test_a_warning_during_the_progress_bar_clears_its_line_first(tmp_path, train, capfd):
    """A notebook showed the bar's line twice, above and below a warning written after it."""
    x, y = train
    mlp(tmp_path / "ws").fit(x, y, nb_epoch=5, progress=False)
    capfd.readouterr()
    mlp(tmp_path / "ws").fit(x, y, nb_epoch=5)      # warns: an earlier run's snapshots
    err = capfd.readouterr().err
    assert "holds snapshots of an earlier run" in err
    assert re.search(r"[\r\n] +[\r\n]singa: .* holds snapshots", err), repr(err[:300])
