"""Caffe net definitions read and brought to today's form: a NetParameter from a `.prototxt`
(text) or a binary file, its V1 `layers` (enum types) and nested V0 layers upgraded to V2
`layer` entries, and the deprecated `input`/`input_dim`/`input_shape` header made an Input
layer, as Caffe's own UpgradeNetAsNeeded does (src/caffe/util/upgrade_proto.cpp)."""
import os

from google.protobuf import text_format

from singa.errors import ConfigError
from singa.io.caffe_blobs import CaffeFile
from singa.proto import caffe_pb2

__all__ = ["Refused", "read_net", "read_text", "upgrade", "in_net_state", "relative_to", "copy_set",
           "strip_legacy", "TRAIN", "TEST"]

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


class Refused(ConfigError):
    """A Caffe net or setting without an exact SINGA equivalent."""


_TEXT_BYTES = 64 << 20      # a text net or solver larger than this is no definition


def read_net(path):
    """The NetParameter of `path` (text or binary) with V2 layers only (see `upgrade`)."""
    if _is_text(path):
        net = read_text(path, caffe_pb2.NetParameter())
    else:
        with CaffeFile(path) as f:
            net, _ = f.net()
    return upgrade(net, path)


def read_text(path, msg):
    """Parse the text-format file `path` into `msg`; a mistake is one line `path:line:col: …`."""
    try:
        with open(path, "rb") as f:
            data = f.read(_TEXT_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    if len(data) > _TEXT_BYTES:
        raise ConfigError(f"{path}: more than {_TEXT_BYTES >> 20} MiB, not a text definition")
    try:
        text_format.Parse(data.decode("utf-8"), msg)
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (UTF-8)") from None
    except text_format.ParseError as e:
        raise ConfigError(f"{path}:{str(e).splitlines()[0]}") from None
    return msg


def upgrade(net, path):
    """`net` with its V1/V0 `layers` and deprecated input fields as V2 `layer` entries."""
    if net.layer and net.layers:
        raise ConfigError(f"{path}: net has both V2 'layer' and V1 'layers' entries")
    out = caffe_pb2.NetParameter()
    out.CopyFrom(net)
    del out.layers[:], out.input[:], out.input_dim[:], out.input_shape[:]
    del out.layer[:]
    if net.input:
        out.layer.append(_input_layer(net, path))
    elif net.input_dim or net.input_shape:
        raise ConfigError(f"{path}: input_dim/input_shape without an 'input' name")
    out.layer.extend(net.layer)
    for v1 in net.layers:
        out.layer.append(_from_v1(v1, path))
    return out


def in_net_state(layer, phase):
    """Caffe's Net::FilterNet for NetState{phase, level 0, no stage}: include rules (any
    met) and exclude rules (none met)."""
    def meets(rule):
        if rule.HasField("phase") and rule.phase != phase:
            return False
        if rule.HasField("min_level") and rule.min_level > 0:
            return False
        if rule.HasField("max_level") and rule.max_level < 0:
            return False
        return not rule.stage
    if layer.include:
        return any(meets(r) for r in layer.include)
    return not any(meets(r) for r in layer.exclude)


def _is_text(path):
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start > len(head) - 4     # a character cut at the 4096th byte
    return True


def _input_layer(net, path):
    """Caffe's UpgradeNetInput: one Input layer "input" whose tops are the inputs."""
    layer = caffe_pb2.LayerParameter(name="input", type="Input", top=list(net.input))
    if net.input_shape:
        if len(net.input_shape) != len(net.input):
            raise ConfigError(f"{path}: {len(net.input)} inputs but {len(net.input_shape)} "
                              f"input_shape entries")
        layer.input_param.shape.extend(net.input_shape)
    else:
        if len(net.input_dim) != 4 * len(net.input):
            raise ConfigError(f"{path}: {len(net.input)} inputs need {4 * len(net.input)} "
                              f"input_dim values, got {len(net.input_dim)}")
        for i in range(len(net.input)):
            layer.input_param.shape.add(dim=net.input_dim[4 * i:4 * i + 4])
    return layer


_V1_TYPES = {
    "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL",
    "CONCAT": "Concat", "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution",
    "DECONVOLUTION": "Deconvolution", "DATA": "Data", "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData", "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise",
    "EXP": "Exp", "FLATTEN": "Flatten", "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col", "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct", "LRN": "LRN",
    "MEMORY_DATA": "MemoryData", "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN", "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU", "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "SILENCE": "Silence",
    "SOFTMAX": "Softmax", "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split", "SLICE": "Slice",
    "TANH": "TanH", "WINDOW_DATA": "WindowData", "THRESHOLD": "Threshold",
}

_V0_TYPES = {"conv": "Convolution", "innerproduct": "InnerProduct", "pool": "Pooling",
             "lrn": "LRN", "dropout": "Dropout", "relu": "ReLU", "tanh": "TanH",
             "sigmoid": "Sigmoid", "softmax": "Softmax", "softmax_loss": "SoftmaxWithLoss",
             "data": "Data", "flatten": "Flatten", "concat": "Concat", "accuracy": "Accuracy"}


def _from_v1(v1, path):
    """Caffe's UpgradeV1LayerParameter (and V0 inside it: UpgradeV0LayerParameter)."""
    layer = caffe_pb2.LayerParameter(name=v1.name, bottom=v1.bottom, top=v1.top,
                                     include=v1.include, exclude=v1.exclude,
                                     loss_weight=v1.loss_weight)
    if v1.HasField("layer"):
        _from_v0(v1.layer, layer, path)
    else:
        layer.type = _V1_TYPES.get(caffe_pb2.V1LayerParameter.LayerType.Name(v1.type), "")
        if not layer.type:
            raise ConfigError(f"{path}: layer '{v1.name}' has V1 type "
                              f"{caffe_pb2.V1LayerParameter.LayerType.Name(v1.type)}, which has "
                              f"no V2 type")
        for field, value in v1.ListFields():
            if field.name.endswith("_param") and field.name in layer.DESCRIPTOR.fields_by_name:
                getattr(layer, field.name).CopyFrom(value)
    _param_specs(layer, v1.param, v1.blobs_lr, v1.weight_decay)
    return layer


def _from_v0(v0, layer, path):
    kind = _V0_TYPES.get(v0.type)
    if kind is None:
        raise ConfigError(f"{path}: layer '{v0.name}' has V0 type '{v0.type}', which this "
                          f"importer does not upgrade")
    layer.type = kind
    layer.name = layer.name or v0.name
    if kind in ("Convolution", "InnerProduct"):
        p = layer.convolution_param if kind == "Convolution" else layer.inner_product_param
        p.num_output = v0.num_output
        p.bias_term = v0.biasterm
        for f in ("weight_filler", "bias_filler"):
            if v0.HasField(f):
                getattr(p, f).CopyFrom(getattr(v0, f))
        if kind == "Convolution":
            p.kernel_size.append(v0.kernelsize)
            p.pad.append(v0.pad)
            p.stride.append(v0.stride)
            p.group = v0.group
    elif kind == "Pooling":
        p = layer.pooling_param
        p.pool, p.kernel_size, p.stride, p.pad = v0.pool, v0.kernelsize, v0.stride, v0.pad
    elif kind == "LRN":
        p = layer.lrn_param
        p.local_size, p.alpha, p.beta, p.k = v0.local_size, v0.alpha, v0.beta, v0.k
    elif kind == "Dropout":
        layer.dropout_param.dropout_ratio = v0.dropout_ratio
    elif kind == "Concat":
        layer.concat_param.concat_dim = v0.concat_dim
    elif kind == "Data":
        layer.data_param.source = v0.source
        layer.data_param.batch_size = v0.batchsize
        layer.data_param.rand_skip = v0.rand_skip
        t = layer.transform_param
        t.scale, t.crop_size, t.mirror = v0.scale, v0.cropsize, v0.mirror
        if v0.meanfile:
            t.mean_file = v0.meanfile
    _param_specs(layer, [], v0.blobs_lr, v0.weight_decay)


def _param_specs(layer, names, lrs, decays):
    for i in range(max(len(names), len(lrs), len(decays))):
        while len(layer.param) <= i:
            layer.param.add()
        if i < len(names) and names[i]:
            layer.param[i].name = names[i]
        if i < len(lrs):
            layer.param[i].lr_mult = lrs[i]
        if i < len(decays):
            layer.param[i].decay_mult = decays[i]


def copy_set(src, dst, names):
    """dst's fields `names` set to src's where src sets them (between a Caffe param and our
    conf of the same field names: unset fields keep both sides' defaults)."""
    for name in names:
        if src.HasField(name):
            setattr(dst, name, getattr(src, name))


def relative_to(path, name):
    """`name` as Caffe would open it from the folder of `path` (absolute names unchanged)."""
    return name if os.path.isabs(name) else os.path.join(os.path.dirname(path) or ".", name)


def strip_legacy(shape, ndim):
    """A legacy num/channels/height/width shape padded at the front with 1s, cut to `ndim`."""
    shape = tuple(shape)
    while len(shape) > ndim and shape[0] == 1:
        shape = shape[1:]
    return shape
