"""Keras' spellings of the Python API's layer builders and optimizers, unknown keywords refused,
and summary_lines."""
import math

import numpy as np
import pytest
from google.protobuf import text_format

from singa import naming
from singa.api import builders
from singa.api.summary import summary_lines
from singa.errors import ConfigError
from singa.layer import (RBM, LRN2D, Activation, AvgPooling2D, Conv2D, Convolution2D, Data,
                         Dense, Flatten, Input, Layer, MaxPooling2D, check_input_shape)
from singa.layers.param import fill
from singa.proto import job_pb2


@pytest.fixture(autouse=True)
def fresh_names():
    naming.reset_names()


def same(proto, expected):
    """`proto` equals the message of its type in text format `expected`."""
    return proto == text_format.Parse(expected, type(proto)())


# --- unknown keywords -------------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: Dense(10, kernel_regularizer='l2'),
     r"Dense: unknown keyword 'kernel_regularizer' \(known: output_dim, activation, init, "
     r"w_param, b_param, input_dim, units, use_bias, kernel_initializer, bias_initializer, "
     r"transpose, input_shape, seed, src, w_/b_<lr\|wd\|type\|user_type\|value\|mean\|std\|low\|"
     r"high>, LayerProto fields\)"),
    (lambda: Dense(10, w_scale=0.1), "Dense: unknown keyword 'w_scale'"),
    (lambda: Convolution2D(32, 3, dilation_rate=2),
     "Convolution2D: unknown keyword 'dilation_rate' .*kernel_size, strides, padding"),
    (lambda: MaxPooling2D(2, data_format='channels_last'),
     "MaxPooling2D: unknown keyword 'data_format' .*known: stride, ignore_border, pool_size"),
    (lambda: Activation('relu', alpha=0.1), "Activation: unknown keyword 'alpha'"),
    (lambda: Flatten(data_format='channels_last'), "Flatten: unknown keyword 'data_format'"),
    (lambda: Layer(units=3), r"Layer: unknown keyword 'units' \(known: input_shape, seed"),
])
def test_a_keyword_no_builder_takes_is_refused_naming_the_known_ones(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_singa_keywords_stay_taken():
    d = Dense(4, w_std=0.5, b_lr=2, transpose=True, partition_dim=1, seed=3, src=None)
    assert d.layer.param[0].init.std == 0.5 and d.layer.innerproduct_conf.transpose
    assert LRN2D(3, alpha=0.00005, knorm=2).layer.lrn_conf.knorm == 2
    assert RBM(10, std=0.1, b_wd=0).layer.param[0].init.std == pytest.approx(0.1)
    assert list(Data('recordinput', path='a.bin', batchsize=8, random_skip=2)
                .layer.store_conf.batchsize) == [8]
    assert Layer(name='fc', type=job_pb2.kInnerProduct, w_lr=2).layer.name == 'fc'


# --- Convolution2D / Conv2D -------------------------------------------------------------------

def test_kernel_size_strides_and_padding_are_keras_rows_then_cols():
    c = Conv2D(8, (1, 3), strides=(1, 2), padding='same')
    assert same(c.layer.convolution_conf, 'num_filters: 8 kernel_x: 3 kernel_y: 1 pad_x: 1 '
                                          'pad_y: 0 stride_x: 2 stride_y: 1')
    assert same(Convolution2D(32, kernel_size=(3, 3)).layer.convolution_conf,
                'num_filters: 32 kernel_x: 3 kernel_y: 3 pad: 0 stride: 1')
    assert same(Conv2D(4, 5, strides=2, padding='valid').layer.convolution_conf,
                'num_filters: 4 kernel: 5 pad: 0 stride: 2')
    assert same(Conv2D(4, 3, padding='same').layer.convolution_conf,
                'num_filters: 4 kernel: 3 pad: 1 stride: 1')


def test_conv2d_output_has_keras_shape_for_a_non_square_kernel():
    m = _model(Data(x=np.zeros((4, 2, 5, 7), np.float32), y=[0, 1, 0, 1], batch_size=2),
               Conv2D(4, (1, 3), strides=(1, 2)), Dense(2, activation='softmax'))
    assert '(4, 5, 3)' in summary_lines(m.build())[3]


@pytest.mark.parametrize("make, message", [
    (lambda: Conv2D(4, 4, padding='same'), "Conv2D: padding 'same' needs an odd kernel"),
    (lambda: Conv2D(4, 3, padding='full'), "Conv2D: padding must be 'valid' or 'same'"),
    (lambda: Convolution2D(4, 3, kernel_size=3), "give kernel or kernel_size, not both"),
    (lambda: Convolution2D(4, 3, pad=1, padding='same'), "give pad or padding, not both"),
    (lambda: Conv2D(4, 3, use_bias=False, b_lr=2), "use_bias=False makes no bias; drop b_lr"),
    (lambda: Dense(4, use_bias=False, bias_initializer='zeros'), "drop bias_initializer"),
    (lambda: Dense(4, units=5), "Dense: give output_dim or units, not both"),
])
def test_keras_spelling_mistakes_are_one_line(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_activation_linear_or_none_adds_no_mask():
    for activation in ('linear', None):
        assert not hasattr(Dense(3, activation=activation), 'mask')
        assert not hasattr(Conv2D(3, 3, activation=activation), 'mask')
    assert Conv2D(3, 3, activation='relu').mask.activation_conf.type == job_pb2.RELU


# --- use_bias=False ---------------------------------------------------------------------------

def test_use_bias_false_gives_the_weight_alone():
    d = Dense(3, use_bias=False)
    assert [p.name for p in d.layer.param] == ['w1'] and not d.layer.innerproduct_conf.bias_term
    assert [p.name for p in Conv2D(2, 3, use_bias=False).layer.param] == ['w2']
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    src = _input(x)
    d.ComputeFeature(src)
    (w,) = d.GetParams()
    np.testing.assert_allclose(d.GetData(), x @ w.T, rtol=1e-5, atol=1e-6)


# --- initializers -----------------------------------------------------------------------------

def _drawn(builder, shape):
    return fill(builder.layer.param[0].init, shape, np.random.default_rng(0)).astype(np.float64)


def _assert_keras(values, name, fan_in, fan_out):
    """`values` drawn as Keras' `name` for these fans: bound and std within sampling error."""
    scale, n, distribution = {'glorot': (1, 'avg'), 'he': (2, 'in'),
                              'lecun': (1, 'in')}[name.split('_')[0]] + (name.split('_')[1],)
    count = fan_in if n == 'in' else (fan_in + fan_out) / 2
    std = math.sqrt(scale / count)
    assert abs(values.mean()) < 4 * std / math.sqrt(values.size)
    if distribution == 'uniform':
        bound = math.sqrt(3) * std
        assert np.abs(values).max() <= bound * (1 + 1e-6)
        assert np.abs(values).max() > 0.99 * bound
    assert values.std() == pytest.approx(std, rel=0.03)


NAMES = ['glorot_uniform', 'he_uniform', 'he_normal', 'lecun_uniform', 'lecun_normal']


@pytest.mark.parametrize("name", NAMES + ['glorot_normal'])
def test_dense_kernel_initializers_draw_keras_formulas(name):
    shaped = Dense(200, kernel_initializer=name, input_shape=(30, 10))
    _assert_keras(_drawn(shaped, (200, 300)), name, 300, 200)
    if name != 'glorot_normal':     # the engine's fan types draw it from the weight's shape
        unshaped = Dense(200, kernel_initializer=name)
        assert unshaped.layer.param[0].init.type != job_pb2.kUniform
        _assert_keras(_drawn(unshaped, (200, 300)), name, 300, 200)


@pytest.mark.parametrize("name", NAMES + ['glorot_normal'])
def test_conv_kernel_initializers_draw_keras_formulas(name):
    # weight (F, C·k·k): fan_in C·k·k, fan_out F·k·k (Keras'), not the engine's rows + cols
    shaped = Conv2D(16, 3, kernel_initializer=name, input_shape=(8, 10, 10))
    _assert_keras(_drawn(shaped, (16, 72)), name, 72, 144)
    if not name.startswith('glorot'):
        _assert_keras(_drawn(Conv2D(16, 3, kernel_initializer=name), (16, 72)), name, 72, 144)


@pytest.mark.parametrize("make, message", [
    (lambda: Conv2D(16, 3, kernel_initializer='glorot_uniform'),
     "Conv2D: kernel_initializer 'glorot_uniform' needs the layer's fan_in and fan_out: give "
     "input_shape"),
    (lambda: Dense(16, kernel_initializer='glorot_normal'), "needs the layer's fan_in"),
    (lambda: Dense(16, kernel_initializer='he_normal', transpose=True), "needs the layer's"),
    (lambda: Dense(16, bias_initializer='he_normal'),
     "Dense: bias_initializer must be one of zeros, ones, random_normal, random_uniform, got "
     "'he_normal'"),
    (lambda: Dense(16, kernel_initializer='xavier'), "kernel_initializer must be one of zeros, "
                                                     "ones, random_normal, random_uniform, glorot"),
    (lambda: Dense(16, init='uniform', kernel_initializer='zeros'),
     "give init or kernel_initializer, not both"),
    (lambda: Conv2D(4, 3, input_shape=(3, 4, 5, 6), kernel_initializer='glorot_uniform'),
     r"input_shape must be \(C, H, W\) or \(H, W\)"),
])
def test_initializers_the_builder_cannot_draw_are_refused(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_fixed_initializers_for_weight_and_bias():
    d = Dense(3, kernel_initializer='random_uniform', bias_initializer='ones')
    assert same(d.layer.param[0].init, 'type: kUniform low: -0.05 high: 0.05')
    assert same(d.layer.param[1].init, 'type: kConstant value: 1')
    d = Dense(3, kernel_initializer='random_normal', bias_initializer='zeros', w_lr=2)
    assert same(d.layer.param[0].init, 'type: kGaussian mean: 0 std: 0.05')
    assert d.layer.param[0].lr_scale == 2
    assert same(d.layer.param[1].init, 'type: kConstant value: 0')
    assert [p.name for p in d.layer.param] == ['w2', 'b2']


# --- pooling, Flatten -------------------------------------------------------------------------

def test_pooling_strides_follow_keras_when_pool_size_is_a_keyword():
    def stride(p):
        return p.layer.pooling_conf.stride
    assert stride(MaxPooling2D(pool_size=2)) == 2 and stride(MaxPooling2D(2)) == 1
    assert stride(AvgPooling2D(pool_size=(3, 3))) == 3
    assert stride(MaxPooling2D(pool_size=(3, 3), stride=2)) == 2     # cifar10_cnn.py's
    assert stride(MaxPooling2D(pool_size=2, strides=1)) == 1
    assert stride(MaxPooling2D(3, strides=(2, 2), padding='valid')) == 2
    with pytest.raises(ConfigError, match="MaxPooling2D: padding must be 'valid'"):
        MaxPooling2D(pool_size=2, padding='same')
    with pytest.raises(ConfigError, match="give stride or strides, not both"):
        MaxPooling2D(2, stride=1, strides=1)
    with pytest.raises(ConfigError, match="give pool_size once"):
        MaxPooling2D(2, pool_size=2)


def test_a_conv_flatten_dense_chain_trains(tmp_path):
    from singa.model import SGD, Cluster
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1, 6, 6)).astype(np.float32)
    y = (x[:, 0, :3].sum(axis=(1, 2)) > x[:, 0, 3:].sum(axis=(1, 2))).astype(int)
    m = _model(Conv2D(4, 3, padding='same', activation='relu', input_shape=(1, 6, 6)),
               MaxPooling2D(pool_size=2), Flatten(), Dense(2, activation='softmax'))
    m.compile(optimizer=SGD(lr=0.1, momentum=0.9), cluster=Cluster(str(tmp_path)),
              loss='categorical_crossentropy')
    history = m.fit(x, y, epochs=30, batch_size=16, progress=False)
    losses = history.history['loss']
    assert losses[-1] < 0.5 * losses[0]
    net = m.build()
    flat = next(ly for ly in net.layer if ly.type == job_pb2.kFlatten)
    assert list(flat.srclayers) == ['pool1'] and \
        next(ly for ly in net.layer if ly.name == 'layer2').srclayers == ['flatten1']


# --- Input, input_shape ------------------------------------------------------------------------

def test_input_and_input_shape_record_the_sample_shape():
    assert Input(shape=(784,)).input_shape == (784,) and Input(shape=(784,)).is_input
    assert Dense(10, input_shape=(100,)).input_shape == (100,)
    assert Dense(10, input_dim=100).input_shape == (100,)
    assert Conv2D(4, 3, input_shape=[1, 28, 28]).input_shape == (1, 28, 28)
    assert Dense(10).input_shape is None
    with pytest.raises(ConfigError, match=r"Input: shape must be a tuple of positive ints"):
        Input(shape=(0, 3))
    with pytest.raises(ConfigError, match="Dense: give input_shape or input_dim, not both"):
        Dense(10, input_dim=100, input_shape=(100,))


def test_check_input_shape_compares_the_first_layer_with_the_samples():
    data = Data(x=np.zeros((2, 784)))
    dense = Dense(10, input_shape=(100,))
    with pytest.raises(ConfigError, match=r"^fit: samples of shape \(784,\) do not match "
                                          r"input_shape \(100,\) of layer 'layer1'$"):
        check_input_shape([data, dense, Dense(3)], (784,), 'fit')
    check_input_shape([data, dense], np.zeros((5, 100)).shape[1:], 'fit')
    check_input_shape([Dense(4)], (784,), 'fit')
    with pytest.raises(ConfigError, match="of layer 'input'"):
        check_input_shape([Input(shape=(28, 28)), Dense(4)], (784,), 'evaluate')
    check_input_shape([Input(shape=(784,)), Dense(4, input_shape=(784,))], (784,), 'fit')
    with pytest.raises(ConfigError, match=r"layer 'layer\d+' has an input_shape \(4,\), but it "
                                          r"is not the first"):
        check_input_shape([Dense(4), Dense(4, input_shape=(4,))], (784,), 'fit')


# --- optimizers ---------------------------------------------------------------------------------

def test_rmsprop_and_adadelta_are_keras_spellings():
    assert builders.RMSprop is builders.RMSProp and builders.Adadelta is builders.AdaDelta
    assert builders.RMSprop(rho=0.8).proto.rmsprop_conf.rho == pytest.approx(0.8)
    assert builders.updater_of('RMSprop').proto.type == job_pb2.kRMSProp
    assert builders.updater_of('Adadelta').proto.type == job_pb2.kAdaDelta


# --- summary ------------------------------------------------------------------------------------

def test_summary_of_an_mlp():
    m = _model(Data(x=np.zeros((4, 20), np.float32), y=[0, 1, 2, 0], batch_size=2),
               Dense(8, activation='relu'), Dense(3, use_bias=False, activation='softmax'))
    lines = summary_lines(m.build())
    assert lines[0].split() == ['Layer', '(type)', 'Output', 'shape', 'Params']
    rows = [line.split() for line in lines[2:-4]]
    assert rows == [['data0', '(RecordInput)', '(20,)', '0'],
                    ['layer1', '(InnerProduct)', '(8,)', f'{20 * 8 + 8}'],
                    ['relu1', '(Activation)', '(8,)', '0'],
                    ['layer2', '(InnerProduct)', '(3,)', f'{8 * 3}'],
                    ['softmax2', '(Softmax)', '(3,)', '0']]
    total = 20 * 8 + 8 + 8 * 3
    assert lines[-3:] == [f'Total params: {total}', f'Trainable params: {total}',
                          'Non-trainable params: 0']


def test_summary_of_a_conv_net():
    m = _model(Data(x=np.zeros((4, 3, 12, 12), np.float32), y=[0, 1, 0, 1], batch_size=2),
               Conv2D(8, 3, padding='same', activation='relu'), MaxPooling2D(pool_size=2),
               Flatten(), Dense(10, activation='softmax'))
    lines = summary_lines(m.build())
    shapes = {line.split()[0]: line[32:56].strip() for line in lines[2:-4]}
    assert shapes == {'data0': '(3, 12, 12)', 'conv1': '(8, 12, 12)', 'relu1': '(8, 12, 12)',
                      'pool1': '(8, 6, 6)', 'flatten1': '(288,)', 'layer2': '(10,)',
                      'softmax2': '(10,)'}
    conv, dense = 8 * 3 * 3 * 3 + 8, 8 * 6 * 6 * 10 + 10
    assert lines[-3] == f"Total params: {conv + dense:,}"


# --- helpers ------------------------------------------------------------------------------------

def _model(*layers):
    from singa.model import Sequential
    m = Sequential('keras')
    for ly in layers:
        m.add(ly)
    return m


def _input(x):
    from singa.layer import Dummy
    src = Dummy()
    src.Feed(x.shape, x, None)
    return src


# --- the model's side: Input, input_shape, summary -----------------------------------------

def conv_model(tmp_path):
    from singa.model import Cluster, Flatten, Input, MaxPooling2D, Sequential
    m = Sequential('keras-cnn')
    m.add(Input(shape=(1, 28, 28)))
    m.add(Conv2D(8, kernel_size=3, activation='relu'))
    m.add(MaxPooling2D(pool_size=2))
    m.add(Flatten())
    m.add(Dense(10, activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer='rmsprop',
              cluster=Cluster(str(tmp_path / "ws")))
    return m


def test_model_summary_gives_keras_table_from_input_shape(tmp_path, capsys):
    conv_model(tmp_path).summary()
    out = capsys.readouterr().out
    assert "(8, 26, 26)" in out and "(8, 13, 13)" in out and "(1352,)" in out
    assert f"Total params: {8 * 9 + 8 + 1352 * 10 + 10:,}" in out


def test_samples_that_do_not_match_input_shape_are_refused_before_training(tmp_path):
    m = conv_model(tmp_path)
    x = np.zeros((10, 784), np.float32)
    with pytest.raises(ConfigError, match=r"^fit: samples of shape \(784,\) do not match "
                                          r"input_shape \(1, 28, 28\)"):
        m.fit(x, np.zeros(10, int), nb_epoch=1, progress=False)


def test_a_model_without_data_or_input_shape_says_so_in_summary(tmp_path):
    from singa.model import Cluster, Sequential
    m = Sequential('bare')
    m.add(Dense(10))
    m.compile(optimizer='sgd', cluster=Cluster(str(tmp_path / "ws")))
    with pytest.raises(ConfigError, match="summary: the model has no data yet"):
        m.summary()


def test_a_gpu_error_of_the_conf_check_is_not_chained(monkeypatch):
    """device=[0] without CuPy: one ConfigError, not "During handling of the above
    exception" over our own traceback."""
    from singa import device
    from singa.job import config

    def no_gpu(ids, what="gpu"):
        raise ConfigError("training on a GPU needs CuPy")
    monkeypatch.setattr(device, "check", no_gpu)
    with pytest.raises(ConfigError, match="needs CuPy") as e:
        config.parse_job('name: "j" neuralnet {} train_one_batch { alg: kBP } '
                         'updater { type: kSGD } cluster { workspace: "/tmp/x" } gpu: 0', "j.conf")
    assert e.value.__suppress_context__
