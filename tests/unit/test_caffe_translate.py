"""singa.interop.caffe.translate: Caffe layers → SINGA layers (exact equivalents only)."""
import os

import numpy as np
import pytest
from google.protobuf import text_format

import singa
from singa.errors import ConfigError
from singa.interop.caffe.netdef import read_net, upgrade
from singa.interop.caffe.translate import Refused, translate
from singa.io.caffe_blobs import Blob
from singa.proto import caffe_pb2, job_pb2

FX = os.path.join(singa.HOME, "tests", "fixtures", "caffe")
HEAD = 'input: "data" input_dim: 2 input_dim: 4 input_dim: 8 input_dim: 8\n'


def net_of(text):
    return upgrade(text_format.Parse(HEAD + text, caffe_pb2.NetParameter()), "n.prototxt")


def layers(t):
    return {layer.name: layer for layer in t.layers}


def test_in_place_layers_become_one_layer_per_output():
    t = translate(read_net(os.path.join(FX, "convnet", "convnet_deploy.prototxt")),
                  "convnet_deploy.prototxt")
    by = layers(t)
    assert list(by["relu1"].srclayers) == ["conv1"]
    assert list(by["pool1"].srclayers) == ["relu1"]       # Caffe's blob conv1 after relu1
    assert list(by["drop1"].srclayers) == ["relu3"]
    assert list(by["ip2"].srclayers) == ["drop1"]
    assert by["conv2"].convolution_conf.group == 2
    assert by["pool1"].pooling_conf.ceil_mode and by["pool2"].pooling_conf.ceil_mode
    assert by["pool2"].pooling_conf.pool == job_pb2.PoolingProto.AVG
    assert by["pool2"].pooling_conf.stride == 2 and by["pool2"].pooling_conf.pad == 1
    assert by["ip1"].innerproduct_conf.transpose
    assert (by["norm1"].lrn_conf.alpha, by["norm1"].lrn_conf.knorm) == (0.5, 1.5)
    assert not any(layer.include for layer in t.layers)     # a deploy net: no phase rules


def test_train_test_net_merges_phases_and_feeds_the_loss_labels():
    t = translate(read_net(os.path.join(FX, "mlp", "mlp_train_test.prototxt")), "n",
                  data_dir="/d", input_shape=(1, 8, 8))
    data = [layer for layer in t.layers if layer.name == "data"]
    assert [list(d.include) for d in data] == [[job_pb2.kTrain], [job_pb2.kTest]]
    assert [d.store_conf.batchsize[0] for d in data] == [32, 50]
    assert [d.store_conf.path for d in data] == ["/d/data-train.kvfile", "/d/data-test.kvfile"]
    loss = layers(t)["loss"]
    assert loss.type == job_pb2.kSoftmaxLoss and list(loss.srclayers) == ["ip2", "data"]
    assert "accuracy" not in layers(t)      # SINGA's softmax loss reports it
    ip1 = layers(t)["ip1"]
    assert [(p.name, p.lr_scale, p.wd_scale) for p in ip1.param] == [
        ("ip1_weight", 1, 1), ("ip1_bias", 2, 0)]
    assert (ip1.param[0].init.type, ip1.param[0].init.std) == (job_pb2.kGaussian,
                                                               pytest.approx(0.1))


@pytest.mark.parametrize("left_out, kept", [(caffe_pb2.TRAIN, caffe_pb2.TEST),
                                             (caffe_pb2.TEST, caffe_pb2.TRAIN)])
def test_a_phase_caffe_cannot_build_is_left_out_and_the_other_is_the_net(left_out, kept):
    """The mlp's train_test net without its TRAIN data layer (the net `caffe test` runs), or
    without its TEST one: the phase that builds alone, without include rules, and a note
    saying why the other is left out."""
    net = read_net(os.path.join(FX, "mlp", "mlp_train_test.prototxt"))
    keep = [layer for layer in net.layer
            if not (layer.type == "HDF5Data" and layer.include[0].phase == left_out)]
    del net.layer[:]
    net.layer.extend(keep)
    t = translate(net, "n", data_dir="/d", input_shape=(1, 8, 8))
    assert t.phases == (kept,)
    assert not any(layer.include for layer in t.layers)
    data = layers(t)["data"]
    phase = caffe_pb2.Phase.Name(kept).lower()
    assert (data.store_conf.batchsize[0], data.store_conf.path) == (
        50 if kept == caffe_pb2.TEST else 32, f"/d/data-{phase}.kvfile")
    assert layers(t)["loss"].srclayers == ["ip2", "data"]
    gone = caffe_pb2.Phase.Name(left_out)
    assert (f"n: no {gone} net (layer 'ip1' reads blob 'data', which no earlier {gone} layer "
            f"writes): the job is the {caffe_pb2.Phase.Name(kept)} net alone") in t.notes
    assert [p.name for p in t.params] == ["ip1_weight", "ip1_bias", "ip2_weight", "ip2_bias"]


def test_a_net_that_no_phase_builds_is_one_line():
    """No input in any phase: Caffe's first unknown bottom blob, said to be missing in all;
    phases missing different blobs: the TRAIN net's."""
    net = upgrade(text_format.Parse(
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
        'inner_product_param { num_output: 2 } }', caffe_pb2.NetParameter()), "n")
    with pytest.raises(Refused) as e:
        translate(net, "n.prototxt")
    assert str(e.value) == ("n.prototxt: layer 'ip' of type InnerProduct reads blob 'data', "
                            "which no earlier layer writes in any phase")
    net = upgrade(text_format.Parse(
        'layer { name: "a" type: "ReLU" bottom: "x" top: "a" include { phase: TRAIN } }\n'
        'layer { name: "b" type: "ReLU" bottom: "y" top: "b" include { phase: TEST } }',
        caffe_pb2.NetParameter()), "n")
    with pytest.raises(Refused) as e:
        translate(net, "n.prototxt")
    assert str(e.value) == ("n.prototxt: layer 'a' of type ReLU reads blob 'x', which no "
                            "earlier layer writes")


def test_param_shapes_from_the_weights():
    w = {"c": [Blob(np.zeros(6 * 2 * 9, np.float32), (6, 2, 3, 3), False),
               Blob(np.zeros(6, np.float32), (6,), False)],
         "ip": [Blob(np.zeros(5 * 6 * 64, np.float32), (1, 1, 5, 384), True),
                Blob(np.zeros(5, np.float32), (1, 1, 1, 5), True)]}
    t = translate(net_of(
        'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { '
        'num_output: 6 kernel_size: 3 pad: 1 group: 2 } }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "c" top: "ip" inner_product_param { '
        'num_output: 5 } }\n'), "n", w, "w.caffemodel")
    assert [(p.name, p.shape) for p in t.params] == [
        ("c_weight", (6, 18)), ("c_bias", (6,)), ("ip_weight", (5, 384)), ("ip_bias", (5,))]


def test_a_blob_of_the_wrong_shape_is_one_line():
    w = {"ip": [Blob(np.zeros(12, np.float32), (4, 3), False),
                Blob(np.zeros(4, np.float32), (4,), False)]}
    with pytest.raises(ConfigError) as e:
        translate(net_of('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                         'inner_product_param { num_output: 5 } }'), "n", w, "w.caffemodel")
    assert str(e.value) == ("w.caffemodel: layer 'ip' blob 0 has shape 4x3, the InnerProduct "
                            "needs 5xK")


def test_no_bias_term_gets_a_zero_bias_never_learned():
    w = {"ip": [Blob(np.ones(15, np.float32), (5, 3), False)]}
    t = translate(net_of('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                         'inner_product_param { num_output: 5 bias_term: false } }'),
                  "n", w, "w")
    bias = layers(t)["ip"].param[1]
    assert (bias.lr_scale, bias.wd_scale) == (0, 0)
    p = t.params[1]
    assert p.blob is None and np.array_equal(p.values, np.zeros(5, np.float32))


@pytest.mark.parametrize("layer, why", [
    ('type: "PReLU" bottom: "data" top: "e"', "has no SINGA equivalent"),
    ('type: "Scale" bottom: "data" bottom: "data" top: "s"', "from a second bottom"),
    ('type: "Eltwise" bottom: "data" bottom: "data" top: "e" eltwise_param { operation: PROD '
     'stable_prod_grad: false }', "stable_prod_grad false"),
    ('type: "Eltwise" bottom: "data" top: "e"', "has 1 bottoms, expected 2 or more"),
    ('type: "ReLU" bottom: "data" top: "r" relu_param { negative_slope: 0.1 }', "negative_slope"),
    ('type: "Pooling" bottom: "data" top: "p" pooling_param { pool: STOCHASTIC kernel_size: 2 }',
     "STOCHASTIC"),
    ('type: "Convolution" bottom: "data" top: "c" convolution_param { num_output: 2 '
     'kernel_size: 3 dilation: 2 }', "dilated"),
    ('type: "ReLU" bottom: "nothing" top: "r"', "reads blob 'nothing'"),
])
def test_refusals_name_the_file_the_layer_and_its_type(layer, why):
    with pytest.raises(Refused) as e:
        translate(net_of(f'layer {{ name: "x" {layer} }}'), "n.prototxt")
    msg = str(e.value)
    kind = layer.split('"')[1]
    assert msg.startswith(f"n.prototxt: layer 'x' of type {kind} ") and why in msg
    assert "\n" not in msg


def test_test_phase_crops_the_centre_and_mirror_is_refused():
    text = ('layer {{ name: "d" type: "Data" top: "data" top: "label" transform_param {{ '
            'crop_size: 4 {} }} data_param {{ source: "s" batch_size: 2 }} }}')
    net = upgrade(text_format.Parse(text.format(""), caffe_pb2.NetParameter()), "n")
    t = translate(net, "n", input_shape=(3, 8, 8))
    crops = {tuple(c.include): c.rgbimage_conf for c in t.layers if c.name == "d_transform"}
    assert crops[(job_pb2.kTest,)].center_crop and not crops[(job_pb2.kTrain,)].center_crop
    net = upgrade(text_format.Parse(text.format("mirror: true"), caffe_pb2.NetParameter()), "n")
    with pytest.raises(Refused, match="mirrors in TEST"):
        translate(net, "n", input_shape=(3, 8, 8))


def test_data_shape_must_be_known():
    net = upgrade(text_format.Parse(
        'layer { name: "d" type: "Data" top: "data" top: "label" data_param { source: "s" '
        'batch_size: 2 } }\nlayer { name: "c" type: "Convolution" bottom: "data" top: "c" '
        'convolution_param { num_output: 2 kernel_size: 3 } }', caffe_pb2.NetParameter()), "n")
    with pytest.raises(Refused, match="-input_shape"):
        translate(net, "n")
    t = translate(net, "n", input_shape=(3, 8, 8))
    assert list(t.layers[0].store_conf.shape) == [3, 8, 8]


def test_scale_not_a_power_of_two_goes_to_image_preprocess():
    net = upgrade(text_format.Parse(
        'layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN } '
        'transform_param { scale: 0.00390625 mirror: true crop_size: 6 } data_param { '
        'source: "s" batch_size: 2 } }\nlayer { name: "d" type: "Data" top: "data" '
        'top: "label" include { phase: TEST } transform_param { scale: 0.017 } data_param { '
        'source: "s" batch_size: 2 } }\nlayer { name: "c" type: "Convolution" bottom: "data" '
        'top: "c" convolution_param { num_output: 2 kernel_size: 3 } }', caffe_pb2.NetParameter()),
        "n")
    by = {(layer.name, tuple(layer.include)): layer for layer in
          translate(net, "n", input_shape=(3, 8, 8)).layers}
    train = by["d_transform", (job_pb2.kTrain,)].rgbimage_conf
    assert (train.cropsize, train.mirror, train.scale) == (6, True, 0.00390625)
    assert by["d_transform", (job_pb2.kTest,)].rgbimage_conf.scale == pytest.approx(0.017)
    assert list(by["c", ()].srclayers) == ["d_transform"]     # the same in both phases


CONV = ('layer { name: "c" type: "Convolution" bottom: "data" top: "c" '
        'convolution_param { num_output: 2 kernel_size: 1 } }\n')


def test_softmax_over_spatial_positions_is_caffes_over_axis_1():
    """Caffe's Softmax normalises each position over the channels: softmax_conf.axis; on
    (N, D) scores SINGA's softmax (over a sample's values) is the same and stays."""
    t = translate(net_of(CONV + 'layer { name: "p" type: "Softmax" bottom: "c" top: "p" }'), "n")
    p = layers(t)["p"]
    assert p.softmax_conf.HasField("axis") and p.softmax_conf.axis == 1
    t = translate(net_of(CONV + 'layer { name: "ip" type: "InnerProduct" bottom: "c" top: "ip" '
                         'inner_product_param { num_output: 3 } }\n'
                         'layer { name: "p" type: "Softmax" bottom: "ip" top: "p" }'), "n")
    assert not layers(t)["p"].softmax_conf.HasField("axis")


def test_a_flatten_only_softmaxes_read_is_a_rename_others_are_kflatten():
    """Our export of a softmax of a 4-D blob is Flatten, Softmax: it comes back as one
    softmax; any other Flatten is a kFlatten layer."""
    flat = CONV + 'layer { name: "f" type: "Flatten" bottom: "c" top: "f" }\n'
    t = translate(net_of(flat + 'layer { name: "p" type: "Softmax" bottom: "f" top: "p" }'), "n")
    assert "f" not in layers(t) and list(layers(t)["p"].srclayers) == ["c"]
    assert not layers(t)["p"].softmax_conf.HasField("axis")
    t = translate(net_of(flat.replace('top: "f" }', 'top: "f" flatten_param { axis: 2 } }') +
                         'layer { name: "ip" type: "InnerProduct" bottom: "f" top: "ip" '
                         'inner_product_param { num_output: 3 } }\n'), "n")
    f = layers(t)["f"]
    assert (f.type, f.flatten_conf.axis, list(layers(t)["ip"].srclayers)) == \
        (job_pb2.kFlatten, 2, ["f"])


STANH = ('layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
         'inner_product_param { num_output: 5 } }\n'
         'layer { name: "s_Bx" type: "Power" bottom: "ip" top: "s_Bx" '
         'power_param { scale: 0.6666667 } }\n'
         'layer { name: "s_tanh" type: "TanH" bottom: "s_Bx" top: "s_tanh" }\n'
         'layer { name: "s" type: "Power" bottom: "s_tanh" top: "s" '
         'power_param { scale: 1.7159047 } }\n'
         'layer { name: "p" type: "Softmax" bottom: "s" top: "p" }\n')


def test_our_exports_stanh_power_tanh_power_is_one_stanh():
    t = translate(net_of(STANH), "n.prototxt")
    assert [(layer.name, layer.type, list(layer.srclayers)) for layer in t.layers] == [
        ("input", job_pb2.kRecordInput, []), ("ip", job_pb2.kInnerProduct, ["input"]),
        ("s", job_pb2.kSTanh, ["ip"]), ("p", job_pb2.kSoftmax, ["s"])]   # s is (N, D)
    # in place (Caffe's usual TanH) it is the same chain
    inplace = STANH.replace('bottom: "s_Bx" top: "s_tanh"', 'bottom: "s_Bx" top: "s_Bx"') \
        .replace('bottom: "s_tanh" top: "s"', 'bottom: "s_Bx" top: "s"')
    assert [layer.type for layer in translate(net_of(inplace), "n").layers] == [
        job_pb2.kRecordInput, job_pb2.kInnerProduct, job_pb2.kSTanh, job_pb2.kSoftmax]


def test_an_stanh_whose_middle_blob_is_read_elsewhere_is_refused():
    net = net_of(STANH + 'layer { name: "q" type: "ReLU" bottom: "s_tanh" top: "q" }\n')
    with pytest.raises(Refused) as e:
        translate(net, "n.prototxt")
    assert str(e.value) == (
        "n.prototxt: layer 's_Bx' of type Power starts an STanh (Power, TanH, Power), but "
        "layer 'q' also reads its blob 's_tanh' (SINGA's kSTanh has no such output)")


def test_a_scaling_power_of_input_images_is_image_preprocess():
    """Our export of kImagePreprocess (no crop): Power (scale) on the input."""
    t = translate(net_of('layer { name: "pre" type: "Power" bottom: "data" top: "pre" '
                         'power_param { scale: 0.017 } }\n'
                         'layer { name: "c" type: "Convolution" bottom: "pre" top: "c" '
                         'convolution_param { num_output: 2 kernel_size: 3 } }\n'), "n")
    pre = layers(t)["pre"]
    assert (pre.type, list(pre.srclayers)) == (job_pb2.kImagePreprocess, ["input"])
    assert np.float32(pre.rgbimage_conf.scale) == np.float32(0.017)
    assert (pre.rgbimage_conf.cropsize, pre.rgbimage_conf.mirror) == (0, False)
    assert list(layers(t)["c"].srclayers) == ["pre"]


@pytest.mark.parametrize("layer", [
    'bottom: "data" top: "y" power_param { power: 2 }',
    'bottom: "data" top: "y" power_param { scale: 2 shift: 1 }',
    'bottom: "data" top: "y" power_param { scale: 0 }',
    # x·scale of a blob other than an input's images (SINGA's kImagePreprocess reads those)
    'bottom: "c" top: "y" power_param { scale: 2 }',
    # the first Power of an STanh without the rest
    'bottom: "c" top: "y" power_param { scale: 0.6666667 }',
])
def test_any_other_power_is_refused_in_one_line(layer):
    net = net_of('layer { name: "c" type: "Convolution" bottom: "data" top: "c" '
                 'convolution_param { num_output: 2 kernel_size: 3 } }\n'
                 f'layer {{ name: "x" type: "Power" {layer} }}\n')
    with pytest.raises(Refused) as e:
        translate(net, "n.prototxt")
    msg = str(e.value)
    assert msg.startswith("n.prototxt: layer 'x' of type Power (power ")
    assert "has no SINGA equivalent" in msg and "\n" not in msg


def blob(*shape):
    return Blob(np.zeros(shape, np.float32).ravel(), shape, False)


def test_caffes_later_layers_and_their_blobs():
    """BatchNorm and Scale in place (three blobs; γ, β), Eltwise, Deconvolution (weight
    (C, F/group, kh, kw), no bias term), Crop, global pooling, LRN WITHIN_CHANNEL (k left at
    1, which Caffe ignores there)."""
    w = {"c": [blob(4, 4, 1, 1)], "bn": [blob(4), blob(4), blob(1)], "sc": [blob(4), blob(4)],
         "up": [blob(4, 2, 4, 4)]}
    t = translate(net_of(
        'layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { '
        'num_output: 4 kernel_size: 1 bias_term: false } }\n'
        'layer { name: "bn" type: "BatchNorm" bottom: "c" top: "c" '
        'batch_norm_param { use_global_stats: true eps: 0.001 } }\n'
        'layer { name: "sc" type: "Scale" bottom: "c" top: "c" scale_param { bias_term: true } }\n'
        'layer { name: "sum" type: "Eltwise" bottom: "c" bottom: "data" top: "sum" '
        'eltwise_param { coeff: 1 coeff: -1 } }\n'
        'layer { name: "up" type: "Deconvolution" bottom: "sum" top: "up" convolution_param { '
        'num_output: 4 group: 2 kernel_size: 4 stride: 2 pad: 1 bias_term: false } }\n'
        'layer { name: "crop" type: "Crop" bottom: "up" bottom: "data" top: "crop" '
        'crop_param { offset: 2 } }\n'
        'layer { name: "n" type: "LRN" bottom: "crop" top: "n" lrn_param { local_size: 3 '
        'alpha: 5e-05 k: 2 norm_region: WITHIN_CHANNEL } }\n'
        'layer { name: "g" type: "Pooling" bottom: "n" top: "g" pooling_param { pool: AVE '
        'global_pooling: true } }\n'), "n", w, "w")
    by = layers(t)
    assert [(n, by[n].type, list(by[n].srclayers)) for n in ("bn", "sc", "sum", "up", "crop")] \
        == [("bn", job_pb2.kCaffeBatchNorm, ["c"]), ("sc", job_pb2.kScale, ["bn"]),
            ("sum", job_pb2.kEltwise, ["sc", "input"]), ("up", job_pb2.kDeconvolution, ["sum"]),
            ("crop", job_pb2.kCrop, ["up", "input"])]
    bc = by["bn"].batch_norm_conf
    assert bc.use_global_stats and bc.eps == pytest.approx(0.001)
    assert not bc.HasField("moving_average_fraction")
    assert by["sc"].scale_conf.bias_term and list(by["sum"].eltwise_conf.coeff) == [1, -1]
    assert (by["up"].convolution_conf.group, by["up"].convolution_conf.stride) == (2, 2)
    assert list(by["crop"].crop_conf.offset) == [2]
    lrn = by["n"].lrn_conf
    assert lrn.norm_region == job_pb2.LRNProto.WITHIN_CHANNEL and not lrn.HasField("knorm")
    assert by["g"].pooling_conf.global_pooling and not by["g"].pooling_conf.HasField("kernel")
    assert {p.name: (p.shape, p.blob) for p in t.params} == {
        "c_weight": ((4, 4), 0), "c_bias": ((4,), None), "bn_mean": ((4,), 0),
        "bn_variance": ((4,), 1), "bn_factor": ((1,), 2), "sc_scale": ((4,), 0),
        "sc_bias": ((4,), 1), "up_weight": ((4, 2, 4, 4), 0), "up_bias": ((4,), None)}
    assert by["sc"].param[0].init.value == 1        # Caffe's Scale fills 1 by default


def test_a_deconvolution_blob_of_the_wrong_shape_is_one_line():
    with pytest.raises(ConfigError) as e:
        translate(net_of('layer { name: "up" type: "Deconvolution" bottom: "data" top: "up" '
                         'convolution_param { num_output: 6 kernel_size: 2 } }'), "n",
                  {"up": [blob(4, 3, 2, 2), blob(6)]}, "w")
    assert str(e.value) == "w: layer 'up' blob 0 has shape 4x3x2x2, the Deconvolution needs Cx6x2x2"
