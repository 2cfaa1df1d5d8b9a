"""compile(loss='mse') is Keras' mean squared error against float y: a Dense model learns a
linear regression, evaluate's loss is numpy's on predict's outputs, the targets survive a
kvfile; SINGA's reconstruction stays under its name and for models without y; float y that
are no class labels are refused in one line."""
import numpy as np
import pytest

from singa import naming
from singa.errors import ConfigError
from singa.io.kvfile import KVFile
from singa.job import config
from singa.model import SGD, Autoencoder, Cluster, Data, Dense, Sequential
from singa.proto import common_pb2, job_pb2

W, B = np.array([1.5, -2.0, 0.5, 3.0]), 0.7


@pytest.fixture(autouse=True)
def fresh_names():
    naming.reset_names()


@pytest.fixture(scope="module")
def linear():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 4)).astype(np.float32)
    return x, x @ W + B + 0.01 * rng.standard_normal(256)


def regression(workspace, outputs=1, loss='mse', metrics=None, data=None):
    m = Sequential('regression')
    if data is not None:
        m.add(data)
    m.add(Dense(outputs, init='uniform'))
    m.compile(loss=loss, optimizer=SGD(lr=0.1), cluster=Cluster(str(workspace)),
              metrics=metrics)
    return m


def loss_types(m):
    return [ly.type for ly in m.build().layer
            if ly.type in (job_pb2.kMSELoss, job_pb2.kEuclideanLoss)]


def test_a_dense_model_learns_a_linear_regression_and_evaluates_numpys_mse(tmp_path, linear):
    x, y = linear
    m = regression(tmp_path, metrics=['mae'])
    h = m.fit(x, y, nb_epoch=200, batch_size=32, seed=1, progress=False)
    assert loss_types(m) == [job_pb2.kMSELoss]
    first, last = h['train'][0][1]['loss'], h['train'][-1][1]['loss']
    assert first > 1 and last < 5e-4      # the noise's variance is 1e-4
    p = m.predict(x)
    assert p.shape == (256, 1)
    got = m.evaluate(x, y, verbose=0)
    assert got['loss'] == pytest.approx(np.mean((p[:, 0] - y) ** 2), abs=1e-5, rel=1e-4)
    assert got['mae'] == pytest.approx(np.mean(np.abs(p[:, 0] - y)), rel=1e-4)
    assert got['loss'] < 5e-4


def test_targets_of_several_outputs_and_integer_targets_are_keras_mse(tmp_path, linear):
    x, y = linear
    y2 = np.stack([y, -y], axis=1)
    m = regression(tmp_path / "a", outputs=2)
    m.fit(x, y2, nb_epoch=100, batch_size=64, seed=1, progress=False)
    p = m.predict(x[:100])
    got = m.evaluate(x[:100], y2[:100], verbose=0)
    assert got['loss'] == pytest.approx(np.mean((p - y2[:100]) ** 2), abs=1e-5, rel=1e-4)
    ints = np.round(y).astype(np.int64)       # Keras takes ints as regression targets too
    m = regression(tmp_path / "b")
    m.fit(x, ints, nb_epoch=50, batch_size=64, seed=1, progress=False)
    assert loss_types(m) == [job_pb2.kMSELoss]
    p = m.predict(x)
    got = m.evaluate(x, ints, verbose=0)
    assert got['loss'] == pytest.approx(np.mean((p[:, 0] - ints) ** 2), abs=1e-5, rel=1e-4)


def test_the_targets_survive_as_kvfile_records(tmp_path, linear):
    x, y = linear
    m = regression(tmp_path, data=Data(x=x[:10], y=y[:10, None], batch_size=5))
    conf = config.parse_job(m.to_conf(str(tmp_path / "job.conf")), check_paths=False,
                            check_layers=True)
    data, = [ly for ly in conf.neuralnet.layer if ly.type == job_pb2.kRecordInput]
    assert data.store_conf.backend == 'kvfile' and data.store_conf.target_dim == 1
    assert [ly.type for ly in conf.neuralnet.layer][-1] == job_pb2.kMSELoss
    with KVFile(data.store_conf.path, "read") as f:
        recs = [common_pb2.RecordProto.FromString(v) for _, v in iter(f.read, None)]
    assert [r.target[0] for r in recs] == y[:10].astype(np.float32).tolist()
    assert not any(r.HasField('label') for r in recs)


def test_mean_squared_error_without_y_is_singas_reconstruction(tmp_path, linear):
    x, _ = linear
    m = regression(tmp_path, outputs=4, loss='mean_squared_error')
    m.fit(x, nb_epoch=2, seed=1, progress=False)      # SINGA's autoencoder scripts: no y
    assert loss_types(m) == [job_pb2.kEuclideanLoss]
    m = regression(tmp_path, outputs=4, loss='mean_squared_error')
    m.fit(Data(x=x), nb_epoch=2, seed=1, progress=False)
    assert loss_types(m) == [job_pb2.kEuclideanLoss]
    m = Sequential('ae')        # SINGA's mnist_ae.py: its data layer first, of SINGA's records
    m.add(Data(load='recordinput', path='x.bin', batchsize=8, shape=784))
    m.add(Autoencoder([16, 4], out_dim=784, activation='sigmoid', param_share=True))
    m.compile(loss='mean_squared_error', optimizer=SGD(), cluster=Cluster(str(tmp_path)))
    assert loss_types(m) == [job_pb2.kEuclideanLoss]
    m = regression(tmp_path, outputs=4, loss='reconstruction')
    m.fit(x, np.zeros(len(x)), nb_epoch=2, seed=1, progress=False)
    assert loss_types(m) == [job_pb2.kEuclideanLoss]
    m = regression(tmp_path, loss='mse', data=Data(x=x, y=x[:, 0].copy()))
    assert loss_types(m) == [job_pb2.kMSELoss]


def test_a_model_of_keras_mse_keeps_it_and_refuses_data_without_y(tmp_path, linear):
    x, y = linear
    m = regression(tmp_path)
    m.fit(x, y, nb_epoch=2, seed=1, progress=False)
    with pytest.raises(ConfigError, match="^evaluate: layer 'mseloss1' compares the outputs "
                                          "with targets: give y"):
        m.evaluate(x, verbose=0)
    assert loss_types(m) == [job_pb2.kMSELoss]


def test_float_y_that_are_no_class_labels_are_refused_by_a_softmax_model(tmp_path, linear):
    x, y = linear
    m = Sequential('classes')
    m.add(Dense(3, init='uniform', activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=SGD(), cluster=Cluster(str(tmp_path)))
    with pytest.raises(ConfigError, match=r"^fit: y holds floats such as [-\d.]+, but layer "
                                          r"'\w+' compares the outputs with class labels: give "
                                          r"class indices \(ints; floats would be truncated\)"):
        m.fit(x, y, nb_epoch=1, progress=False)
    h = m.fit(x, np.arange(len(x)) % 3.0, nb_epoch=2, seed=1, progress=False)
    assert set(h.history) == {'loss', 'accuracy'}


def test_compile_names_its_losses_and_the_metrics_of_each(tmp_path):
    with pytest.raises(ConfigError, match="loss 'hinge' is not known .*'mean_squared_error', "
                                          "'reconstruction'"):
        regression(tmp_path, loss='hinge')
    with pytest.raises(ConfigError, match="metric 'accuracy' is not computed by the "
                                          "mean_squared_error's layers \\(they give loss, mae\\)"):
        regression(tmp_path, metrics=['accuracy'])
