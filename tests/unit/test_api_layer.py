"""The Python API's layer builders (SINGA 0.3's tool/python/singa/layer.py) and the interactive layer API."""
import logging
import re

import numpy as np
import pytest
from google.protobuf import text_format

from singa import checkpoint, naming
from singa.errors import ConfigError
from singa.initializations import get_init_values
from singa.layer import (RBM, RGB, Accuracy, Activation, Autoencoder, AvgPooling2D,
                         Convolution2D, Data, Dense, Dropout, ImageInput, LabelInput, Layer,
                         LayerUpdater, Loss, LRN2D, MaxPooling2D, load_model_parameter,
                         save_model_parameter)
from singa.naming import (enumAlgType, enumInitMethod, enumLayerType, enumPhase, generate_name,
                          setval)
from singa.net.neuralnet import NeuralNet
from singa.parameter import Parameter, set_param_field
from singa.proto import job_pb2


@pytest.fixture(autouse=True)
def fresh_names():
    naming.reset_names()


@pytest.fixture
def singa_log(caplog, monkeypatch):
    """caplog sees the "singa" logger even after singa.log.setup stopped its propagation."""
    monkeypatch.setattr(logging.getLogger('singa'), 'propagate', True)
    caplog.set_level(logging.INFO, logger='singa')
    return caplog


def text(proto):
    return text_format.MessageToString(proto)


def assert_layer(proto, expected):
    """`proto` equals the LayerProto of text `expected`, field presence included."""
    assert text(proto) == text(text_format.Parse(expected, job_pb2.LayerProto()))


W = 'name: "w{n}" init {{ type: kGaussian mean: 0 std: {std} }} lr_scale: {lr} wd_scale: {wd}'
B = 'name: "b{n}" init {{ type: kConstant value: 0 }} lr_scale: {lr} wd_scale: {wd}'


def params(n, std=0.01, w_lr=1, w_wd=1, b_lr=1, b_wd=1):
    return (f"param {{ {W.format(n=n, std=std, lr=w_lr, wd=w_wd)} }} "
            f"param {{ {B.format(n=n, lr=b_lr, wd=b_wd)} }}")


# --- builders ----------------------------------------------------------------------------------

def test_dense_defaults_to_gaussian_weight_and_constant_bias_named_after_the_layer():
    assert_layer(Dense(10).layer, f'name: "layer1" type: kInnerProduct '
                                  f'innerproduct_conf {{ num_output: 10 }} {params(1)}')
    assert_layer(Dense(5).layer, f'name: "layer2" type: kInnerProduct '
                                 f'innerproduct_conf {{ num_output: 5 }} {params(2)}')


def test_dense_uniform_init_gives_both_params_u_minus_to_plus_005():
    u = 'init { type: kUniform low: -0.05 high: 0.05 } lr_scale: 1 wd_scale: 1'
    assert_layer(Dense(2500, init='uniform').layer,
                 f'name: "layer1" type: kInnerProduct innerproduct_conf {{ num_output: 2500 }} '
                 f'param {{ name: "w1" {u} }} param {{ name: "b1" {u} }}')


def test_dense_shortcuts_and_softmax_activation_as_in_cifar10_cnn():
    d = Dense(10, w_wd=250, b_lr=2, b_wd=0, activation='softmax')
    assert_layer(d.layer, 'name: "layer1" type: kInnerProduct innerproduct_conf { num_output: 10 } '
                          f'{params(1, w_wd=250, b_lr=2, b_wd=0)}')
    assert_layer(d.mask, 'name: "softmax1" type: kSoftmax')


def test_dense_init_field_shortcuts_and_transpose():
    d = Dense(4, w_std=0.5, w_lr=3, b_value=0.1, transpose=True)
    assert_layer(d.layer, 'name: "layer1" type: kInnerProduct '
                          'innerproduct_conf { num_output: 4 transpose: true } '
                          f'param {{ {W.format(n=1, std=0.5, lr=3, wd=1)} }} '
                          'param { name: "b1" init { type: kConstant value: 0.1 } '
                          'lr_scale: 1 wd_scale: 1 }')


@pytest.mark.parametrize("name, expected", [
    ('stanh', 'name: "stanh0" type: kSTanh'),
    ('softmax', 'name: "softmax0" type: kSoftmax'),
    ('relu', 'name: "relu0" type: kActivation activation_conf { type: RELU }'),
    ('sigmoid', 'name: "sigmoid0" type: kActivation activation_conf { type: SIGMOID }'),
    ('tanh', 'name: "tanh0" type: kActivation activation_conf { type: TANH }'),
])
def test_activation_types(name, expected, singa_log):
    assert_layer(Activation(name).layer, expected)
    assert not singa_log.records     # tanh runs on our CPU layers: no warning


def test_convolution_as_in_cifar10_cnn():
    c = Convolution2D(32, 5, 1, 2, w_std=0.0001, b_lr=2)
    assert_layer(c.layer, 'name: "conv1" type: kCConvolution convolution_conf { num_filters: 32 '
                          f'kernel: 5 stride: 1 pad: 2 }} {params(1, std=0.0001, b_lr=2)}')


def test_convolution_pairs_and_activation_mask():
    c = Convolution2D(8, (3, 5), stride=(1, 2), pad=(0, 1), init='uniform', activation='relu')
    u = 'init { type: kUniform low: -0.05 high: 0.05 } lr_scale: 1 wd_scale: 1'
    assert_layer(c.layer, 'name: "conv1" type: kCConvolution convolution_conf { num_filters: 8 '
                          'kernel_x: 3 kernel_y: 5 stride_x: 1 stride_y: 2 pad_x: 0 pad_y: 1 } '
                          f'param {{ name: "w1" {u} }} param {{ name: "b1" {u} }}')
    assert_layer(c.mask, 'name: "relu1" type: kActivation activation_conf { type: RELU }')


def test_pooling_lrn_and_names_numbered_after_the_last_layer():
    Convolution2D(32, 5, 1, 2)
    assert_layer(MaxPooling2D(pool_size=(3, 3), stride=2).layer,
                 'name: "pool1" type: kCPooling '
                 'pooling_conf { pool: MAX kernel: 3 stride: 2 pad: 0 }')
    assert_layer(AvgPooling2D(3, ignore_border=False).layer,
                 'name: "pool1" type: kCPooling '
                 'pooling_conf { pool: AVG kernel: 3 stride: 1 pad: 1 }')
    assert_layer(LRN2D(3, alpha=0.00005, beta=0.75).layer,
                 'name: "norm1" type: kLRN lrn_conf { local_size: 3 alpha: 0.00005 beta: 0.75 '
                 'knorm: 1 }')


def test_loss_dropout_accuracy_rgb():
    assert_layer(Loss('softmaxloss').layer,
                 'name: "softmaxloss0" type: kSoftmaxLoss softmaxloss_conf { topk: 1 }')
    assert_layer(Loss('euclideanloss').layer, 'name: "euclideanloss0" type: kEuclideanLoss')
    assert_layer(Dropout().layer,
                 'name: "dropout0" type: kDropout dropout_conf { dropout_ratio: 0.5 }')
    assert_layer(Dropout(0.25, partition_dim=1).layer,
                 'name: "dropout0" type: kDropout partition_dim: 1 '
                 'dropout_conf { dropout_ratio: 0.25 }')
    assert_layer(Accuracy().layer, 'name: "accuracy0" type: kAccuracy')
    assert_layer(RGB('mean.bin').layer,
                 'name: "rgb0" type: kRGBImage rgbimage_conf { meanfile: "mean.bin" }')


def test_a_parameter_shared_by_dense_layers_gives_each_its_own_names():
    # mnist_mlp_parameter.py: SINGA named every one of these params w1
    par = Parameter(init='uniform', scale=0.05)
    u = 'init { type: kUniform low: -0.05 high: 0.05 } lr_scale: 1 wd_scale: 1'
    d1 = Dense(2500, w_param=par, b_param=par, activation='tanh')
    d2 = Dense(10, w_param=par, b_param=par, activation='softmax')
    for n, d, dim in ((1, d1, 2500), (2, d2, 10)):
        assert_layer(d.layer, f'name: "layer{n}" type: kInnerProduct innerproduct_conf '
                              f'{{ num_output: {dim} }} param {{ name: "w{n}" {u} }} '
                              f'param {{ name: "b{n}" {u} }}')
    assert d1.mask.name == 'tanh1' and d2.mask.name == 'softmax2'
    assert par.param.name == 'param1'


def test_parameter_templates_carry_shortcuts_and_updates_as_in_cifar10_cnn_parameter():
    parw = Parameter(init='gaussian', std=0.0001)
    parb = Parameter(init='constant')
    c1 = Convolution2D(32, 5, 1, 2, w_param=parw, b_param=parb, b_lr=2)
    MaxPooling2D(pool_size=(3, 3), stride=2)
    parw.update(std=0.01)
    c2 = Convolution2D(32, 5, 1, 2, w_param=parw, b_param=parb)
    c3 = Convolution2D(64, 5, 1, 2, w_param=parw, b_param=parb, b_lr=1)
    d = Dense(10, w_param=parw, w_wd=250, b_param=parb, b_lr=2, b_wd=0, activation='softmax')
    conv = 'type: kCConvolution convolution_conf {{ num_filters: {f} kernel: 5 stride: 1 pad: 2 }}'
    assert_layer(c1.layer, f'name: "conv1" {conv.format(f=32)} {params(1, std=0.0001, b_lr=2)}')
    # b_lr=2 stays with parb (SINGA's, which is why the script gives conv3 b_lr=1)
    assert_layer(c2.layer, f'name: "conv2" {conv.format(f=32)} {params(2, b_lr=2)}')
    assert_layer(c3.layer, f'name: "conv3" {conv.format(f=64)} {params(3)}')
    assert_layer(d.layer, 'name: "layer4" type: kInnerProduct innerproduct_conf { num_output: 10 } '
                          f'{params(4, w_wd=250, b_lr=2, b_wd=0)}')


def test_rbm_and_its_bidirectional_hidden_layer_as_in_mnist_rbm1():
    r = RBM(1000, w_std=0.1, b_wd=0)
    assert r.out_dim == [1000] and r.layer_type == job_pb2.kRBMVis
    assert_layer(r.layer, f'name: "RBMVis" type: kRBMVis rbm_conf {{ hdim: 1000 }} '
                          f'{params(1, std=0.1, b_wd=0)}')
    assert_layer(r.bidirect, 'name: "RBMHid" type: kRBMHid rbm_conf { hdim: 1000 } '
                             'param { name: "w1_" share_from: "w1" lr_scale: 1 wd_scale: 1 } '
                             f'param {{ {B.format(n=12, lr=1, wd=0)} }}')


def test_rbm_stack_names_params_after_its_level_and_samples_gaussian_hidden_units():
    r = RBM([1000, 500], sampling='gaussian', w_std=0.1, b_wd=0)
    assert_layer(r.layer, f'name: "RBMVis" type: kRBMVis rbm_conf {{ hdim: 500 }} '
                          f'{params(2, std=0.1, b_wd=0)}')
    assert_layer(r.bidirect, 'name: "RBMHid" type: kRBMHid rbm_conf { hdim: 500 gaussian: true } '
                             'param { name: "w2_" share_from: "w2" lr_scale: 1 wd_scale: 1 } '
                             f'param {{ {B.format(n=22, lr=1, wd=0)} }}')


def test_autoencoder_carries_what_sequential_expands():
    a = Autoencoder([1000, 500], out_dim=784, activation='sigmoid')
    assert (a.hid_dim, a.out_dim, a.activation, a.param_share, a.layer_type) == \
        ([1000, 500], 784, 'sigmoid', True, 'AutoEncoder')
    assert Autoencoder(30, out_dim=784, param_share=False).hid_dim == [30]


def test_data_from_a_store_conf_or_store_fields():
    store = job_pb2.StoreProto(path='examples/mnist/test_data.bin', backend='kvfile')
    d = Data(load='recordinput', phase='test', conf=store, checkpoint=['step1-worker0'])
    assert_layer(d.layer, 'name: "data0" type: kRecordInput include: kTest '
                          'store_conf { path: "examples/mnist/test_data.bin" backend: "kvfile" }')
    assert d.is_datalayer and d.checkpoint == ['step1-worker0']
    d = Data('recordinput', path='train.bin', batchsize=64, shape=784, std_value=127.5,
             partition_dim=0)
    assert_layer(d.layer, 'name: "data0" type: kRecordInput include: kTrain partition_dim: 0 '
                          'store_conf { path: "train.bin" batchsize: 64 shape: 784 '
                          'std_value: 127.5 }')
    assert d.checkpoint is None


def test_data_from_numpy_samples_reads_the_memory_store():
    from singa.io import memory
    x = np.arange(5 * 6, dtype=np.uint8).reshape(5, 2, 3)
    d = Data(x=x, y=[0, 1, 2, 3, 4], phase='test', batch_size=2, random_skip=3, std_value=255.0)
    conf = d.layer.store_conf
    assert_layer(d.layer, 'name: "data0" type: kRecordInput include: kTest store_conf { '
                          f'backend: "memory" path: "{conf.path}" batchsize: 2 shape: 2 shape: 3 '
                          'random_skip: 3 std_value: 255 }')
    xs, ys = memory.arrays(conf.path)
    assert xs is x and ys.tolist() == [0, 1, 2, 3, 4]
    d = Data(x=x.reshape(5, 6), shape=(6,))     # the default batch of 64: the 5 samples, once
    assert list(d.layer.store_conf.shape) == [6] and list(d.layer.store_conf.batchsize) == [5]
    assert memory.arrays(d.layer.store_conf.path)[1] is None
    assert list(Data(x=x, batch_size=10**9).layer.store_conf.batchsize) == [5]


def test_data_given_to_a_stand_in_register(monkeypatch):
    from singa.io import memory
    got = []
    monkeypatch.setattr(memory, 'register', lambda x, y=None: got.append((x, y)) or 'memory://7')
    x = np.zeros((3, 4), np.float32)
    assert Data(x=x).layer.store_conf.path == 'memory://7' and got == [(x, None)]


def test_layer_keywords_that_are_no_field_are_skipped():
    ly = Layer(name='fc', type=job_pb2.kInnerProduct, w_lr=2, src=None)
    assert_layer(ly.layer, 'name: "fc" type: kInnerProduct')
    assert Layer().layer.name == 'layer1'


@pytest.mark.parametrize("make, message", [
    (lambda: Dense(0), "Dense: output_dim must be a positive int, got 0"),
    (lambda: Dense(2.5), "Dense: output_dim must be a positive int, got 2.5"),
    (lambda: Convolution2D(0, 5), "Convolution2D: nb_filter must be a positive int, got 0"),
    (lambda: Convolution2D(32), "Convolution2D: kernel must be an int >= 1 or a pair of them, "
                                "got 0"),
    (lambda: Convolution2D(32, 5, pad=-1), "Convolution2D: pad must be an int >= 0"),
    (lambda: Convolution2D(32, 5, stride=(1, 2, 3)), "Convolution2D: stride must be"),
    (lambda: MaxPooling2D(), r"MaxPooling2D: pool_size must be an int or a square \(k, k\), "
                             "got None"),
    (lambda: AvgPooling2D(pool_size=(2, 3)), r"AvgPooling2D: pool_size must be .* got \(2, 3\)"),
    (lambda: MaxPooling2D(3, stride=0), "MaxPooling2D: stride must be a positive int, got 0"),
    (lambda: LRN2D(), "LRN2D: size must be a positive int, got 0"),
    (lambda: Activation('elu'), "Activation: activation must be one of stanh, softmax, relu, "
                                "sigmoid, tanh, got 'elu'"),
    (lambda: Dropout(1.0), r"Dropout: ratio must be in \[0, 1\), got 1.0"),
    (lambda: RGB(), "RGB: meanfile is required"),
    (lambda: Loss('hingeloss'), "LayerType has no value 'hingeloss'"),
    (lambda: RBM(), "RBM: out_dim must be a positive int or a list of them, got None"),
    (lambda: RBM([1000, 0]), r"RBM: out_dim must be .* got \[1000, 0\]"),
    (lambda: Autoencoder(None, 784), "Autoencoder: hid_dim must be"),
    (lambda: Autoencoder([10], 0), "Autoencoder: out_dim must be a positive int, got 0"),
    (lambda: Data(), "Data: give load .* or x .*, one of them"),
    (lambda: Data('recordinput', x=np.zeros((2, 2))), "Data: give load"),
    (lambda: Data('kvinput'), "Data: load 'kvinput' is no layer type"),
    (lambda: Data(x=np.zeros((2, 2)), conf=job_pb2.StoreProto()), "Data: numpy samples x make"),
    (lambda: Data('recordinput', phase='training'), "Phase has no value 'training'"),
    (lambda: Parameter(init='xavier'), "Parameter: init must be one of uniform, gaussian, "
                                       "constant, none, got 'xavier'"),
    (lambda: set_param_field(job_pb2.ParamProto(), 'x'),
     "set_param_field: pname must be 'w' or 'b'"),
    (lambda: get_init_values('xavier'), "get_init_values: identifier must be one of"),
])
def test_bad_arguments_raise_config_errors_naming_them(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


# --- names, enums, setval, params ----------------------------------------------------------------

def test_generate_name_follows_singa_counters():
    assert generate_name('w') == 'w0'
    assert generate_name('layer', 1) == 'layer1' and generate_name('conv', 1) == 'conv2'
    assert generate_name('b', 2) == 'b3' and generate_name('pool') == 'pool2'
    assert generate_name('param', 1) == 'param1' and generate_name('param') == 'param1'
    assert generate_name('RBMVis', withnumber=False) == 'RBMVis'


def test_enum_lookups_take_the_value_name_without_its_first_letter_lower_cased():
    assert enumLayerType('softmaxloss') == job_pb2.kSoftmaxLoss
    assert enumLayerType('recordinput') == job_pb2.kRecordInput
    assert enumAlgType('bp') == job_pb2.kBP and enumAlgType('cd') == job_pb2.kCD
    assert enumPhase('train') == job_pb2.kTrain and enumPhase('test') == job_pb2.kTest
    assert enumInitMethod('uniform') == job_pb2.kUniform
    assert naming.enumUpdaterType('sgd') == job_pb2.kSGD
    assert enumInitMethod.__name__ == 'enumInitMethod'


def test_setval_merges_messages_extends_repeated_fields_and_skips_unknown_keys():
    ly = job_pb2.LayerProto()
    setval(ly, name='x', include=job_pb2.kTest, srclayers=['a', 'b'], no_such_field=3,
           param=job_pb2.ParamProto(name='w'), store_conf=job_pb2.StoreProto(path='p'))
    setval(ly.store_conf, shape=(3, 4), batchsize=8)
    assert_layer(ly, 'name: "x" include: kTest srclayers: "a" srclayers: "b" param { name: "w" } '
                     'store_conf { path: "p" shape: 3 shape: 4 batchsize: 8 }')


def test_get_init_values():
    assert get_init_values('uniform') == {'low': -0.05, 'high': 0.05}
    assert get_init_values('uniform', scale=0.3, high=1) == {'low': -0.3, 'high': 1}
    assert get_init_values('gaussian', std=2) == {'mean': 0, 'std': 2}
    assert get_init_values('constant') == {'value': 0}
    assert get_init_values('lrn2d', alpha=5e-5) == {'alpha': 5e-5, 'beta': 0.75, 'knorm': 1}
    assert get_init_values('none') is None


def test_parameter_names_levels_inits_and_updates():
    assert text(Parameter().param) == text(text_format.Parse(
        'name: "param1" init { type: kUniform } lr_scale: 1 wd_scale: 1', job_pb2.ParamProto()))
    assert Parameter(name='w', init='none', level=2).param.name == 'w2'
    b = Parameter(name='b', init='none', level=1, lr=2, wd=0)
    assert text(b.param) == text(text_format.Parse('name: "b12" lr_scale: 2 wd_scale: 0',
                                                   job_pb2.ParamProto()))
    p = Parameter(init='gaussian', std=0.5, share_from='w1')
    p.update(std=0.01, lr_scale=3)
    assert text(p.param) == text(text_format.Parse(
        'name: "param2" init { type: kGaussian mean: 0 std: 0.01 } lr_scale: 3 wd_scale: 1 '
        'share_from: "w1"', job_pb2.ParamProto()))


def test_set_param_field_renames_generated_names_or_when_asked():
    naming.generate_name('layer', 1)
    p = Parameter(init='constant').param
    set_param_field(p, 'b', b_lr=2, w_lr=5, b_value=0.2)
    assert (p.name, p.lr_scale, p.init.value) == ('b1', 2, pytest.approx(0.2))
    set_param_field(p, 'b')
    assert p.name == 'b1' and p.lr_scale == 2
    set_param_field(p, 'w', changename=True, withnumber=False, level=3)
    assert p.name == 'w3'


# --- the interactive API -------------------------------------------------------------------------

def sgd(lr, momentum=0.0):
    proto = job_pb2.UpdaterProto(type=job_pb2.kSGD, momentum=momentum)
    proto.learning_rate.type = job_pb2.kFixed
    proto.learning_rate.base_lr = lr
    return LayerUpdater(proto)


def fed_input(x, width=3, height=2):
    inp = ImageInput(width, height)
    inp.Feed(x)
    return inp


def test_dense_forward_and_backward_agree_with_float64_numpy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    inp = fed_input(x)
    d1 = Dense(5, init='uniform', activation='tanh')
    d2 = Dense(3, w_std=0.3)
    d1.ComputeFeature(inp)
    d2.ComputeFeature(d1)
    (w1, b1), (w2, b2) = [[a.astype(np.float64) for a in d.GetParams()] for d in (d1, d2)]
    assert w1.shape == (5, 6) and b1.shape == (5,) and w2.shape == (3, 5)
    h = np.tanh(x @ w1.T + b1)
    y = h @ w2.T + b2
    np.testing.assert_allclose(d1.GetData(), h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d2.GetData(), y, rtol=1e-5, atol=1e-6)

    g = rng.standard_normal(y.shape)
    d2.output().grad[...] = g           # what a layer above d2 would write
    d2.ComputeGradient()
    d1.ComputeGradient()
    gh = g @ w2
    ga = gh * (1 - h ** 2)
    for p, want in zip(d2.params + d1.params, [g.T @ h, g.sum(0), ga.T @ x, ga.sum(0)]):
        np.testing.assert_allclose(p.grad, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(d1.output().grad, gh, rtol=1e-5, atol=1e-6)


def test_get_and_set_params_round_trip():
    d = Dense(4)
    d.ComputeFeature(fed_input(np.ones((2, 6))))
    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    d.SetParams(w, np.array([[1], [2], [3], [4]]))      # SINGA's bias shape (n, 1) too
    got_w, got_b = d.GetParams()
    np.testing.assert_array_equal(got_w, w)
    np.testing.assert_array_equal(got_b, [1, 2, 3, 4])
    got_w[...] = 0                                        # copies, not the layer's arrays
    np.testing.assert_array_equal(d.GetParams()[0], w)
    d.SetParams(got_w)                                    # fewer arrays: the first params
    assert not d.GetParams()[0].any()
    with pytest.raises(ConfigError, match=r"SetParams: layer 'layer1' param 'w1' has shape "
                                          r"\(4, 6\), got an array of shape \(6, 5\)"):
        d.SetParams(np.zeros((6, 5)))
    with pytest.raises(ConfigError, match="has 2 params, got 3 arrays"):
        d.SetParams(w, w, w)


def test_a_layer_that_has_not_run_says_so():
    with pytest.raises(ConfigError, match="GetParams: layer 'layer1' has not run yet; call its "
                                          "ComputeFeature"):
        Dense(3).GetParams()
    with pytest.raises(ConfigError, match="output: layer 'dummy' has not run yet"):
        Dense(3).ComputeFeature(ImageInput(2, 2))


def test_params_are_reproducible_per_layer_name_and_seed():
    def weights(**kw):
        naming.reset_names()
        d = Dense(3, init='uniform', **kw)
        d.ComputeFeature(fed_input(np.ones((2, 6))))
        return d.GetParams()[0]
    first = weights()
    np.testing.assert_array_equal(first, weights())
    assert not np.array_equal(first, weights(seed=7))
    assert np.abs(first).max() <= 0.05


def test_image_input_takes_square_images_without_a_size_and_label_input_its_labels():
    inp = ImageInput(nb_channel=2)
    inp.Feed(np.arange(2 * 18).reshape(2, 18))
    assert inp.GetData().shape == (2, 2, 3, 3)
    with pytest.raises(ConfigError, match="ImageInput: an image of 10 values is not 1 channel"):
        ImageInput().Feed(np.zeros((2, 10)))
    label = LabelInput()
    label.Feed(np.array([[3], [1]], np.uint8))
    assert label.output().aux_data.tolist() == [3, 1]


def test_dropout_constructs_and_drops_in_training():
    drop = Dropout(0.5)
    drop.ComputeFeature(fed_input(np.ones((100, 6))))
    out = drop.GetData()
    assert set(np.unique(out)) == {0.0, 2.0} and 0.35 < (out == 0).mean() < 0.65


def test_layer_updater_applies_the_rule_with_state_per_param_and_lr_scales():
    d = Dense(2, b_lr=2)
    d.ComputeFeature(fed_input(np.ones((1, 6))))
    upd = sgd(0.1, momentum=0.9)
    w0, b0 = d.GetParams()
    for step in (1, 2):
        for p in d.params:
            p.grad[...] = 1
        d.UpdateParams(step, upd)
    w, b = d.GetParams()
    # h1 = -lr·g, h2 = 0.9·h1 - lr·g: w2 = w0 + h1 + h2 = w0 - 0.29·lr_scale
    np.testing.assert_allclose(w, w0 - 0.29, rtol=1e-6)
    np.testing.assert_allclose(b, b0 - 0.58, rtol=1e-6)
    assert [p.version for p in d.params] == [2, 2]


def test_train_mnist_loop_lowers_the_loss_on_separable_data(capsys):
    rng = np.random.default_rng(0)
    centers = rng.normal(0, 3, (10, 64))
    y = rng.integers(0, 10, 640)
    x = (centers[y] + rng.normal(0, 1, (640, 64))).astype(np.float32)
    inp, label = ImageInput(8, 8), LabelInput()
    nn = [inp, Dense(32, init='uniform'), Activation('stanh'), Dense(10, init='uniform')]
    loss = Loss('softmaxloss')
    upd = sgd(0.05)
    losses = []
    for i in range(30):
        b = slice(i % 10 * 64, (i % 10 + 1) * 64)
        nn[0].Feed(x[b])
        label.Feed(y[b].reshape(-1, 1))
        for h in range(1, len(nn)):
            nn[h].ComputeFeature(nn[h - 1])
        loss.ComputeFeature(nn[-1], label)
        if (i + 1) % 5 == 0:
            shown = loss.display()
            assert re.fullmatch(r"Loss = \d+\.\d{6}, accuracy = \d\.\d{6}", shown)
            losses.append(float(shown.split()[2].rstrip(',')))
        loss.ComputeGradient()
        for h in range(len(nn) - 1, 0, -1):
            nn[h].ComputeGradient()
            upd.update(i + 1, nn[h])
    assert losses[-1] < 0.5 * losses[0] and losses == sorted(losses, reverse=True)
    assert capsys.readouterr().out.startswith("Loss = ")
    assert nn[1].display() == ''                # no metrics


def test_cifar10_style_layers_run_a_step():
    rng = np.random.default_rng(1)
    inp, label = ImageInput(8, 8, 3), LabelInput()
    nn = [inp, Convolution2D(4, 3, 1, 1, w_std=0.1, b_lr=2),
          MaxPooling2D(pool_size=(3, 3), stride=2), Activation('relu'), LRN2D(3, alpha=0.00005, beta=0.75),
          AvgPooling2D(pool_size=(3, 3), stride=2), Dense(10, w_wd=250, b_lr=2, b_wd=0)]
    loss = Loss('softmaxloss')
    upd = sgd(0.01)
    inp.Feed(rng.standard_normal((5, 192)))
    label.Feed(rng.integers(0, 10, (5, 1)))
    for h in range(1, len(nn)):
        nn[h].ComputeFeature(nn[h - 1])
    loss.ComputeFeature(nn[-1], label)
    loss.ComputeGradient()
    before = nn[1].GetParams()[0]
    for h in range(len(nn) - 1, 0, -1):
        nn[h].ComputeGradient()
        upd.update(1, nn[h])
    after = nn[1].GetParams()[0]
    assert after.shape == (4, 27) and not np.array_equal(before, after)
    assert np.isfinite(float(loss.display().split()[2].rstrip(',')))


def mlp():
    naming.reset_names()
    return [ImageInput(3, 2), Dense(4, activation='sigmoid'), Dense(2, init='uniform')]


def test_save_then_load_model_parameter_round_trip(tmp_path):
    net = mlp()
    net[0].Feed(np.ones((2, 6)))
    for h in (1, 2):
        net[h].ComputeFeature(net[h - 1])
    rng = np.random.default_rng(5)
    for ly in net[1:]:     # not the values the same names and seeds draw again
        ly.SetParams(*(rng.standard_normal(a.shape) for a in ly.GetParams()))
    net[2].params[0].version = 7
    path = save_model_parameter(5, str(tmp_path / 'ck'), net)
    assert path == str(tmp_path / 'ck' / 'step5-worker0.bin')
    assert checkpoint.CheckpointReader(path).names == ['0#w1', '0#b1', '0#w2', '0#b2']

    again = mlp()
    loaded = load_model_parameter(path[:-len('.bin')], again, batchsize=3)
    assert sorted(loaded) == ['0#b1', '0#b2', '0#w1', '0#w2']
    assert again[0].output().data.shape == (3, 1, 2, 3)
    for a, b in zip(net[1:], again[1:]):
        for want, got in zip(a.GetParams(), b.GetParams()):
            np.testing.assert_array_equal(want, got)
    assert [p.version for p in again[2].params] == [7, 0]


def test_a_saved_file_loads_in_a_job_net_with_the_same_param_names(tmp_path):
    net = mlp()
    net[0].Feed(np.ones((2, 6)))
    net[1].ComputeFeature(net[0])
    net[1].SetParams(np.full((4, 6), 0.5), np.arange(4))
    path = save_model_parameter(1, str(tmp_path), net[:2])
    conf = text_format.Parse("""
        layer { name: "in" type: kDummy dummy_conf { input: true shape: 2 shape: 6 } }
        layer { name: "fc" type: kInnerProduct srclayers: "in" innerproduct_conf { num_output: 4 }
                param { name: "w1" init { type: kConstant value: 9 } }
                param { name: "b1" init { type: kConstant value: 9 } } }""", job_pb2.NetProto())
    job_net = NeuralNet(conf, job_pb2.kTrain, np.random.default_rng(0))
    owners = {p.name: p for p in job_net.params}
    files = checkpoint.open_checkpoint_path([path[:-len('.bin')]], str(tmp_path))
    assert sorted(checkpoint.load_params(files, owners)) == ['0#b1', '0#w1']
    np.testing.assert_array_equal(owners['0#w1'].data, np.full((4, 6), 0.5))
    np.testing.assert_array_equal(owners['0#b1'].data, np.arange(4))


def test_a_file_with_singa_interactive_names_loads_too(tmp_path):
    path = checkpoint.write_file(str(tmp_path / 'step3-worker0'),
                                 [('w1', np.full((4, 6), 2.0), 3), ('b1', np.ones(4), 3)])
    net = mlp()[:2]
    load_model_parameter(path, net, data_shape=(2, 1, 2, 3))
    w, b = net[1].GetParams()
    assert (w == 2).all() and (b == 1).all() and [p.version for p in net[1].params] == [3, 3]


def test_save_and_load_mistakes(tmp_path):
    net = mlp()
    with pytest.raises(ConfigError, match="save_model_parameter: layer 'layer1' has not run yet"):
        save_model_parameter(1, str(tmp_path), net)
    with pytest.raises(ConfigError, match="give data_shape for input layer 'dummy'"):
        load_model_parameter(str(tmp_path / 'x'), [LabelInput(), Dense(2)])
    par = Parameter(name='w', init='constant', level=1)
    twins = [ImageInput(3, 2), Dense(2, w_param=par), Dense(2, w_param=par)]
    twins[0].Feed(np.ones((1, 6)))
    twins[1].ComputeFeature(twins[0])
    twins[2].ComputeFeature(twins[1])
    with pytest.raises(ConfigError, match="save_model_parameter: two params named 'w1'"):
        save_model_parameter(1, str(tmp_path), twins)
