"""Layers of the Python API (SINGA 0.3's tool/python/singa/layer.py): LayerProto builders, and the interactive API (SINGA-126) that runs them on our engine.

Builders make the LayerProto `layer` SINGA's helper made from the same arguments (names from
`singa.naming.generate_name`); `singa.model` chains them into a NetProto. Dense and
Convolution2D built with `activation=` carry the activation's LayerProto as `mask`; RBM carries
its hidden layer as `bidirect`. A keyword no builder takes is a ConfigError (SINGA's skipped
it). Keras' spellings with a SINGA meaning are taken too (Conv2D, Flatten, Input,
`kernel_size`, `use_bias`, `kernel_initializer`, `input_shape`, ...: docs/python.md); a builder
given `input_shape` (or Input) records the sample shape it expects, which `check_input_shape`
compares with the data.

The interactive API: `ComputeFeature(*srclayers)` creates and sets up the engine layer
(`singa.layers.base.create_layer`; params drawn from their `init`) on first use, then runs it
and its mask forward in training mode; `ComputeGradient()` runs them backward;
`LayerUpdater(updater_proto).update(step, layer)` applies an updater rule to a layer's params;
`Dummy` / `ImageInput` / `LabelInput` feed numpy batches; `save_model_parameter` /
`load_model_parameter` write and read SINGA checkpoint files.
"""
import logging
import math
import numbers
import os
import zlib

import numpy as np

from singa import checkpoint
from singa.api import arguments
from singa.errors import ConfigError
from singa.initializations import get_init_values
from singa.io.records import holds_targets
import singa.layers  # noqa: F401  (registers every layer type)
from singa.layers.base import create_layer, set_up
from singa.log import format_metrics
from singa.naming import *  # noqa: F401,F403  (SINGA's `from singa.layer import *` gave them)
from singa.naming import __all__ as _naming_names
from singa.naming import (enumLayerType, enumPhase, generate_name, is_unrolled, setval,
                          unrolled)
from singa.parameter import Parameter, set_param_field
from singa.proto import job_pb2
from singa.train.updater import create_updater

__all__ = ["Layer", "Data", "Convolution2D", "Conv2D", "MaxPooling2D", "AvgPooling2D", "LRN2D",
           "Loss", "Activation", "Dropout", "Accuracy", "RGB", "Dense", "Flatten", "Input",
           "Autoencoder", "RBM", "Dummy", "ImageInput", "LabelInput", "LayerUpdater",
           "check_input_shape", "save_model_parameter", "load_model_parameter", "Parameter",
           "set_param_field", "get_init_values", *_naming_names]

log = logging.getLogger("singa")

TRAIN_FORWARD = job_pb2.kTrain | job_pb2.kForward
TRAIN_BACKWARD = job_pb2.kTrain | job_pb2.kBackward

#: activation name -> (layer type, activation_conf.type or None)
ACTIVATIONS = {
    'stanh': (job_pb2.kSTanh, None),
    'softmax': (job_pb2.kSoftmax, None),
    'relu': (job_pb2.kActivation, job_pb2.RELU),
    'sigmoid': (job_pb2.kActivation, job_pb2.SIGMOID),
    'tanh': (job_pb2.kActivation, job_pb2.TANH),
}



class Layer:
    """A LayerProto `layer` set from keyword fields (named `layer<n>` unless `name` is given)
    and, once it has run, the engine layers behind it.

    Keywords besides the LayerProto fields: the params' shortcuts w_lr, w_wd, b_lr, b_wd,
    w_<init field>, b_<init field> (set_param_field's), a builder's `keywords`, and:
    `seed` seeds the generator the layer's params and its randomness (dropout) are drawn
    from; by default the CRC-32 of the layer's name, so runs are reproducible. `src` (a list
    of layers) fixes the sources ComputeFeature reads, whatever it is given. `input_shape`
    (Keras'): the shape of the samples it reads, a tuple kept as `input_shape` (None if not
    given). Any other keyword is a ConfigError naming the known ones.
    """

    #: keywords the builder takes besides its parameters, LayerProto fields and shortcuts
    keywords = ()

    def __init__(self, input_shape=None, **kwargs):
        arguments.check_keywords(self, kwargs)
        self.layer = job_pb2.LayerProto()
        setval(self.layer, **kwargs)
        if 'name' not in kwargs:
            self.layer.name = generate_name('layer', 1)
        self.input_shape = None if input_shape is None else \
            arguments.sample_shape(type(self).__name__, 'input_shape', input_shape)
        self.is_datalayer = False
        self.srclayers = []
        self.src = kwargs.get('src')
        self.seed = kwargs.get('seed')
        self.engines = []       # [(engine layer, its engine sources)]: the layer, then its mask

    # --- the interactive API ---------------------------------------------------------------
    def setup(self, srclys):
        """Create and set up the engine layer (and the mask's) reading the layers `srclys`;
        draw each param that has an `init` (the others, init 'none', stay 0 until loaded)."""
        if self.engines:
            return
        srcs = [s.output() for s in srclys]
        rng = self._generator()
        for conf in [self.layer] + ([self.mask] if hasattr(self, 'mask') else []):
            engine = _create(conf, rng)
            set_up(engine, srcs)
            for p in engine.params:
                if p.proto.HasField('init'):
                    p.init_values(rng)
            self.engines.append((engine, srcs))
            srcs = [engine]
        self.srclayers = list(srclys)

    def _generator(self):
        seed = self.seed if self.seed is not None else zlib.crc32(self.layer.name.encode())
        return np.random.default_rng(seed)

    def ComputeFeature(self, *srclys):
        """Forward in training mode from the layers `srclys` (set up on the first call)."""
        self.setup(self.src or srclys)
        for engine, srcs in self.engines:
            engine.compute_feature(TRAIN_FORWARD, srcs)

    def ComputeGradient(self):
        """Backward: the mask, then the layer; fills the params' grads and the sources' grads
        (from this layer's grad, written by the layer above)."""
        for engine, srcs in reversed(self._ran('ComputeGradient')):
            engine.compute_gradient(TRAIN_BACKWARD, srcs)

    def UpdateParams(self, step, upd):
        """Update the params with `upd`, an Updater of singa.model (SGD, ...) or a LayerUpdater."""
        (upd.Update if hasattr(upd, 'Update') else upd.update)(step, self)

    @property
    def params(self):
        """The engine's Params (singa.layers.param.Param), [] until the layer has run."""
        return [p for engine, _ in self.engines for p in engine.params]

    def GetParams(self):
        """Copies of the param values, shaped as the engine holds them: Dense (weight (out, in),
        bias (out,)), Convolution2D (weight (filters, channels·k·k), bias (filters,)). SINGA
        returned the bias as (n, 1)."""
        self._ran('GetParams')
        return tuple(p.data.copy() for p in self.params)

    def SetParams(self, *params):
        """Set the param values in order (weight, bias): arrays of each param's size."""
        self._ran('SetParams')
        own = self.params
        if len(params) > len(own):
            raise ConfigError(f"SetParams: layer '{self.layer.name}' has {len(own)} params, "
                              f"got {len(params)} arrays")
        for p, value in zip(own, params):
            value = np.asarray(value)
            if value.size != p.data.size:
                raise ConfigError(f"SetParams: layer '{self.layer.name}' param '{p.name}' has "
                                  f"shape {p.data.shape}, got an array of shape {value.shape}")
            p.data[...] = value.reshape(p.data.shape)

    def GetData(self):
        """A copy of the output (the mask's, with an activation)."""
        return self.output().data.copy()

    def display(self):
        """Print the metrics since the last display (a loss layer: `Loss = ..., accuracy = ...`)
        on stdout and return that text ('' for layers without metrics). A print, as SINGA's:
        scripts end their own `print('  Step 10: ', end=' ')` line with it."""
        text = format_metrics(self.output().metrics(TRAIN_FORWARD))
        if text:
            print(text)
        return text

    def output(self):
        """The engine layer that layers reading this one read: the mask's, with an activation."""
        return self._ran('output')[-1][0]

    def _ran(self, what):
        if not self.engines:
            raise ConfigError(f"{what}: layer '{self.layer.name}' has not run yet; call its "
                              f"ComputeFeature (Feed for input layers) first")
        return self.engines


class Dummy(Layer):
    """An input layer fed numpy batches (SINGA's DummyLayer::Feed): `Feed(shape, data, aux_data)`
    with samples `data` (N rows of shape[1:]) and/or integer labels `aux_data` (N)."""

    def __init__(self, **kwargs):   # keywords ignored, as SINGA's
        super().__init__(name='dummy', type=job_pb2.kDummy)
        self.is_datalayer = True
        self.srclayers = None

    def setup(self, data_shape):
        """Create the engine's input DummyLayer of `data_shape` (the batch shape)."""
        if self.engines:
            return
        self.layer.dummy_conf.input = True
        self.layer.dummy_conf.shape.extend(int(d) for d in data_shape)
        engine = _create(self.layer, self._generator())
        set_up(engine, [])
        engine.grad = None      # no one reads dL/d input: the first layer may skip it
        self.engines.append((engine, []))

    def Feed(self, shape, data, aux_data):
        self.setup(shape)
        self.engines[0][0].feed(data, aux_data)

    def data_shape(self, batchsize):
        """The batch shape load_model_parameter sets up, or None if it must be given."""
        return None


class ImageInput(Dummy):
    """Feeds images: rows of nb_channel·height·width values (or arrays of that shape), as
    (N, nb_channel, height, width); without width and height, square images."""

    def __init__(self, width=None, height=None, nb_channel=1):
        super().__init__()
        self.width, self.height, self.nb_channel = width, height, nb_channel

    def Feed(self, image_data):
        n = len(image_data)
        size = np.asarray(image_data[0]).size
        w, h = self.width, self.height
        if w is None or h is None:
            w = h = math.isqrt(size // self.nb_channel)
        if w * h * self.nb_channel != size:
            raise ConfigError(f"ImageInput: an image of {size} values is not {self.nb_channel} "
                              f"channel(s) of {h}x{w}")
        super().Feed((n, self.nb_channel, h, w), image_data, None)

    def data_shape(self, batchsize):
        if self.width is None or self.height is None:
            return None
        return (batchsize, self.nb_channel, self.height, self.width)


class LabelInput(Dummy):
    """Feeds integer labels, one per sample (shape (N,) or SINGA's (N, 1))."""

    def Feed(self, label_data):
        super().Feed(np.shape(label_data), None, label_data)


class Data(Layer):
    """An input layer of the job: type `load` (an enumLayerType name: 'recordinput', ...)
    reading StoreProto `conf` (a singa.model.Store or a StoreProto) or the StoreProto fields
    among the keywords (path, backend, batchsize, shape, ...); `phase` goes to `include`;
    `checkpoint` is the checkpoint_path list for the job (pretrained params).

    Numpy samples instead: `Data(x=array, y=labels or None, batch_size=64, ...)` is a
    kRecordInput layer over the "memory" store of `singa.io.memory.register(x, y)`, shape
    x.shape[1:] unless `shape` is given; random_skip, mean_value, std_value as keywords. A
    batch_size beyond the samples is their number (Keras's rule: a batch never repeats one).
    `y` of floats not all integers, (N,) or (N, k), are regression targets
    (store_conf.target_dim k, for a kMSELoss); other `y` are class labels (a model of Keras'
    mean squared error reads them as targets too).
    """

    keywords = tuple(job_pb2.StoreProto.DESCRIPTOR.fields_by_name)

    def __init__(self, load=None, phase='train', checkpoint=None, conf=None, x=None, y=None,
                 batch_size=64, **kwargs):
        if (load is None) == (x is None):
            raise ConfigError("Data: give load (a data layer type such as 'recordinput') or "
                              "x (numpy samples), one of them")
        if x is not None and conf is not None:
            raise ConfigError("Data: numpy samples x make their own store; drop conf")
        if x is not None:
            kwargs.setdefault('shape', list(np.shape(x)[1:]))
            n = len(x)
            whole = isinstance(batch_size, (int, np.integer)) and batch_size > n > 0
            kwargs.setdefault('batchsize', n if whole else batch_size)
            load = 'recordinput'
        try:
            layer_type = enumLayerType(load)
        except ConfigError:
            raise ConfigError(f"Data: load {load!r} is no layer type (e.g. 'recordinput', "
                              f"'csvinput')") from None
        super().__init__(**{'name': generate_name('data'), **kwargs}, type=layer_type)
        self.is_datalayer = True
        #: a model names it again where it joins (SINGA's name there: `data<n>` of its counter)
        self.generated_name = 'name' not in kwargs
        self.layer.include.append(enumPhase(phase))
        if x is not None:
            from singa.io import memory
            self.layer.store_conf.backend = 'memory'
            self.layer.store_conf.path = memory.register(x, y)
            if holds_targets(y):
                self.layer.store_conf.target_dim = int(np.prod(np.shape(y)[1:], dtype=int))
        if conf is None:
            setval(self.layer.store_conf, **kwargs)
        else:
            self.layer.store_conf.MergeFrom(getattr(conf, 'proto', conf))
        self.checkpoint = checkpoint


class Convolution2D(Layer):
    """kCConvolution: `nb_filter` filters of `kernel` (int or (x, y)), `stride` (default 1),
    `pad` (default 0); weight Gaussian(0, 0.01) and bias constant 0 unless `init` or
    w_param/b_param; shortcuts w_lr, w_wd, b_lr, b_wd, w_<init field>, b_<init field>;
    `activation` → `mask` ('linear' or None: none).

    Keras' spellings: `kernel_size` and `strides` (int or (rows, cols): y first, the reverse
    of kernel's pair), `padding` 'valid' (pad 0) or 'same' (pad k//2: odd kernels only; with
    strides > 1 Keras pads one pixel less before than after), `use_bias=False` (the weight
    alone), `kernel_initializer` / `bias_initializer` (a name of
    arguments.FIXED_INITIALIZERS or, for the weight, arguments.SCALED_INITIALIZERS: glorot_*
    need the input channels C from `input_shape` (C, H, W), or (H, W) for C = 1).
    """

    def __init__(self, nb_filter=0, kernel=None, stride=None, pad=None, init=None, w_param=None,
                 b_param=None, activation=None, kernel_size=None, strides=None, padding=None,
                 use_bias=True, kernel_initializer=None, bias_initializer=None, **kwargs):
        name = type(self).__name__
        arguments.check_positive(name, 'nb_filter', nb_filter)
        kernel = arguments.alias(name, 'kernel', kernel, 'kernel_size',
                                 arguments.yx(kernel_size), 0)
        stride = arguments.alias(name, 'stride', stride, 'strides', arguments.yx(strides), 1)
        super().__init__(**{'name': generate_name('conv', 1), **kwargs}, type=job_pb2.kCConvolution)
        conf = self.layer.convolution_conf
        conf.num_filters = nb_filter
        arguments.set_xy(conf, 'kernel', kernel)
        arguments.set_xy(conf, 'stride', stride)
        pad = arguments.alias(name, 'pad', pad, 'padding',
                              arguments.keras_pad(name, padding, kernel), 0)
        arguments.set_xy(conf, 'pad', pad, low=0)
        fans = None
        if self.input_shape is not None:
            if len(self.input_shape) not in (2, 3):
                raise ConfigError(f"{name}: input_shape must be (C, H, W) or (H, W), got "
                                  f"{self.input_shape}")
            taps = conf.kernel ** 2 if conf.HasField('kernel') else conf.kernel_x * conf.kernel_y
            channels = self.input_shape[0] if len(self.input_shape) == 3 else 1
            fans = (channels * taps, nb_filter * taps)
        exact = (job_pb2.kGaussianSqrtFanIn, job_pb2.kUniformSqrtFanIn)
        _add_params(self, True, init, w_param, b_param, use_bias, kernel_initializer,
                    bias_initializer, fans, exact, kwargs)
        _set_mask(self, activation)


class Conv2D(Convolution2D):
    """Keras' Conv2D(filters, kernel_size, strides=1, padding='valid', activation=None,
    use_bias=True, kernel_initializer=None, bias_initializer=None): Convolution2D by Keras'
    spellings (its defaults SINGA's: weight Gaussian(0, 0.01), bias 0)."""

    def __init__(self, filters=0, kernel_size=None, strides=None, padding=None, activation=None,
                 use_bias=True, kernel_initializer=None, bias_initializer=None, **kwargs):
        super().__init__(filters, kernel_size=kernel_size, strides=strides, padding=padding,
                         activation=activation, use_bias=use_bias,
                         kernel_initializer=kernel_initializer,
                         bias_initializer=bias_initializer, **kwargs)


class MaxPooling2D(Layer):
    """kCPooling MAX over square `pool_size` windows (int or (k, k)), `stride`; pad 0
    (ignore_border) or 1.

    The default stride: SINGA's 1 when pool_size is given by position, Keras' pool_size when
    it is given by keyword (`MaxPooling2D(2)`: stride 1; `MaxPooling2D(pool_size=2)`: stride
    2). Keras' spellings: `strides` (int or (k, k)) and `padding='valid'` (pad 0).
    """
    method = job_pb2.PoolingProto.MAX

    def __init__(self, size=None, /, stride=None, ignore_border=True, *, pool_size=None,
                 strides=None, padding=None, **kwargs):
        name = type(self).__name__
        if size is not None and pool_size is not None:
            raise ConfigError(f"{name}: give pool_size once (by position or by keyword)")
        keras = pool_size is not None
        pool_size = size if pool_size is None else pool_size
        stride = arguments.alias(name, 'stride', stride, 'strides', strides)
        if padding not in (None, 'valid'):
            raise ConfigError(f"{name}: padding must be 'valid' (pad 0; ignore_border=False pads "
                              f"1), got {padding!r}")
        if isinstance(pool_size, numbers.Integral):
            pool_size = (pool_size, pool_size)
        if not (isinstance(pool_size, (tuple, list)) and len(pool_size) == 2
                and pool_size[0] == pool_size[1]):
            raise ConfigError(f"{name}: pool_size must be an int or a square (k, k), got "
                              f"{pool_size!r}")
        arguments.check_positive(name, 'pool_size', pool_size[0])
        if stride is None:
            stride = pool_size[0] if keras else 1
        if isinstance(stride, (tuple, list)) and len(stride) == 2 and stride[0] == stride[1]:
            stride = stride[0]
        arguments.check_positive(name, 'stride', stride)
        super().__init__(**{'name': generate_name('pool'), **kwargs}, type=job_pb2.kCPooling)
        setval(self.layer.pooling_conf, pool=self.method, kernel=pool_size[0], stride=stride,
               pad=0 if ignore_border else 1)


class AvgPooling2D(MaxPooling2D):
    """kCPooling AVG over square `pool_size` windows, `stride`; pad 0 (ignore_border) or 1;
    the default stride and Keras' spellings as MaxPooling2D's."""
    method = job_pb2.PoolingProto.AVG


class LRN2D(Layer):
    """kLRN over `size` channels: alpha 1, beta 0.75, knorm 1 unless given."""
    keywords = ('alpha', 'beta', 'knorm')

    def __init__(self, size=0, **kwargs):
        arguments.check_positive('LRN2D', 'size', size)
        super().__init__(**{'name': generate_name('norm'), **kwargs}, type=job_pb2.kLRN)
        self.layer.lrn_conf.local_size = size
        setval(self.layer.lrn_conf, **get_init_values('lrn2d', **kwargs))


class Loss(Layer):
    """A loss layer of type `lossname` ('softmaxloss', 'euclideanloss', 'mseloss'); softmaxloss
    counts a hit when the label is among the `topk` scores."""

    def __init__(self, lossname, topk=1, **kwargs):
        super().__init__(**{'name': generate_name(lossname), **kwargs},
                         type=enumLayerType(lossname))
        if lossname == 'softmaxloss':
            self.layer.softmaxloss_conf.topk = topk


class Activation(Layer):
    """'stanh' → kSTanh, 'softmax' → kSoftmax, 'relu' / 'sigmoid' / 'tanh' → kActivation."""

    def __init__(self, activation='stanh', **kwargs):
        if activation not in ACTIVATIONS:
            raise ConfigError(f"Activation: activation must be one of {', '.join(ACTIVATIONS)}, "
                              f"got {activation!r}")
        layer_type, function = ACTIVATIONS[activation]
        super().__init__(**{'name': generate_name(activation), **kwargs}, type=layer_type)
        if function is not None:
            self.layer.activation_conf.type = function


class Dropout(Layer):
    """kDropout dropping a `ratio` of the neurons in training."""

    def __init__(self, ratio=0.5, **kwargs):
        if not 0 <= ratio < 1:
            raise ConfigError(f"Dropout: ratio must be in [0, 1), got {ratio!r}")
        super().__init__(**{'name': generate_name('dropout'), **kwargs}, type=job_pb2.kDropout)
        self.layer.dropout_conf.dropout_ratio = ratio


class Accuracy(Layer):
    """kAccuracy."""

    def __init__(self, **kwargs):
        super().__init__(**{'name': generate_name('accuracy'), **kwargs}, type=job_pb2.kAccuracy)


class RGB(Layer):
    """kRGBImage subtracting the mean image of `meanfile`."""

    def __init__(self, meanfile=None, **kwargs):
        if not meanfile:
            raise ConfigError("RGB: meanfile is required")
        super().__init__(**{'name': generate_name('rgb'), **kwargs}, type=job_pb2.kRGBImage)
        self.layer.rgbimage_conf.meanfile = meanfile


class Dense(Layer):
    """kInnerProduct of `output_dim` outputs: weight Gaussian(0, 0.01) and bias constant 0,
    or both of `init` ('uniform': U(-0.05, 0.05)), or w_param/b_param; shortcuts w_lr,
    w_wd, b_lr, b_wd, w_<init field>, b_<init field>; `transpose`; `activation` → `mask`
    ('linear' or None: none).

    Keras' spellings: `units` (output_dim), `input_dim` (input_shape (input_dim,)),
    `use_bias=False` (bias_term false, the weight alone), `kernel_initializer` /
    `bias_initializer` (a name of arguments.FIXED_INITIALIZERS or, for the weight,
    arguments.SCALED_INITIALIZERS: glorot_normal, and any with `transpose`, need `input_shape`).
    """
    keywords = ('transpose',)

    def __init__(self, output_dim=None, activation=None, init=None, w_param=None, b_param=None,
                 input_dim=None, units=None, use_bias=True, kernel_initializer=None,
                 bias_initializer=None, **kwargs):
        output_dim = arguments.alias('Dense', 'output_dim', output_dim, 'units', units, 0)
        arguments.check_positive('Dense', 'output_dim', output_dim)
        if input_dim is not None:
            kwargs['input_shape'] = arguments.alias(
                'Dense', 'input_shape', kwargs.get('input_shape'), 'input_dim', (input_dim,))
        # the counter advances even for a named layer: its params are numbered after it
        super().__init__(**{'name': generate_name('layer', 1), **kwargs},
                         type=job_pb2.kInnerProduct)
        self.layer.innerproduct_conf.num_output = output_dim
        transpose = kwargs.get('transpose', False)
        if 'transpose' in kwargs:
            self.layer.innerproduct_conf.transpose = transpose
        if not use_bias:
            self.layer.innerproduct_conf.bias_term = False
        fans = None if self.input_shape is None else (math.prod(self.input_shape), output_dim)
        # the weight is (fan_out, fan_in), transposed (fan_in, fan_out)
        exact = (job_pb2.kUniformSqrtFanInOut,) + (() if transpose else (
            job_pb2.kGaussianSqrtFanIn, job_pb2.kUniformSqrtFanIn))
        _add_params(self, False, init, w_param, b_param, use_bias, kernel_initializer,
                    bias_initializer, fans, exact, kwargs)
        _set_mask(self, activation)


class Flatten(Layer):
    """kFlatten: each sample's axes as one, (N, C, H, W) → (N, C·H·W) (Keras' Flatten; a Dense
    reads its source flattened anyway)."""

    def __init__(self, **kwargs):
        super().__init__(**{'name': generate_name('flatten'), **kwargs}, type=job_pb2.kFlatten)


class Input:
    """Keras' Input(shape=...): no layer, the shape of the samples the model reads, a tuple
    `input_shape`; a model keeps it aside (`is_input`) for `check_input_shape`."""
    is_input = True
    is_datalayer = False

    def __init__(self, shape=None, name='input'):
        self.input_shape = arguments.sample_shape('Input', 'shape', shape)
        self.name = name


class Autoencoder:
    """Dense layers `hid_dim` (int or list) up to `out_dim` with `activation`; Sequential.add
    expands it (decoder weights tied to the encoder's when `param_share`)."""

    def __init__(self, hid_dim=None, out_dim=0, activation=None, param_share=True):
        arguments.check_positive('Autoencoder', 'out_dim', out_dim)
        self.hid_dim = arguments.dims('Autoencoder', 'hid_dim', hid_dim)
        self.out_dim = out_dim
        self.layer_type = 'AutoEncoder'
        self.activation = activation
        self.param_share = param_share


class RBM(Layer):
    """kRBMVis with `out_dim[-1]` hidden units (out_dim an int or a list, the stack's sizes:
    Energy.add puts sigmoid Dense layers for the others below it); weight w<L> Gaussian(0,
    0.01), bias b<L> constant 0, L = len(out_dim), shortcuts as Dense. `bidirect` is its kRBMHid
    LayerProto: weight w<L>_ shared from w<L>, bias b<L>2 (wd_scale 0); `sampling='gaussian'`
    makes the hidden units Gaussian.
    """

    #: Parameter's keywords: they set both params (SINGA's)
    keywords = ('lr', 'wd', 'scale', 'low', 'high', 'mean', 'std', 'value')

    def __init__(self, out_dim=None, w_param=None, b_param=None, sampling=None, **kwargs):
        self.out_dim = arguments.dims('RBM', 'out_dim', out_dim)
        self.name = kwargs.pop('name', 'RBMVis')
        self.layer_type = kwargs.pop('type', job_pb2.kRBMVis)
        super().__init__(name=generate_name(self.name, withnumber=False), type=self.layer_type,
                         **kwargs)
        hidden = self.layer_type == job_pb2.kRBMHid
        self.layer.rbm_conf.hdim = self.out_dim[-1]
        if hidden and sampling == 'gaussian':
            self.layer.rbm_conf.gaussian = True
        level = len(self.out_dim)
        taken = []
        for par, role, init in ((w_param, 'w', 'gaussian'), (b_param, 'b', 'constant')):
            if hidden and par is not None:      # the visible layer named it
                taken.append(par.param)
            else:
                par = par or Parameter(init=init, **kwargs)
                taken.append(_take(par, role, False, init, withnumber=False, level=level,
                                   **kwargs))
        for proto in taken:
            self.layer.param.add().CopyFrom(proto)
        if not hidden:
            wname, bname = taken[0].name, taken[1].name
            parw = Parameter(name=wname + '_', init='none', share_from=wname)
            parb = Parameter(name=bname + '2', wd=0, init='constant')
            self.bidirect = RBM(self.out_dim, name='RBMHid', type=job_pb2.kRBMHid,
                                w_param=parw, b_param=parb, sampling=sampling).layer


def check_input_shape(layers, sample_shape, what):
    """ConfigError when the first of `layers` (builders and Input objects; data layers are
    skipped) was given an `input_shape` other than `sample_shape`, the shape of the samples
    fed (an Input and the layer after it both count as first), or when a later layer was given
    one: only the first layer's is the samples' shape."""
    shape = tuple(int(d) for d in sample_shape)
    first = True
    for ly in layers:
        if ly.is_datalayer:
            continue
        expected = getattr(ly, 'input_shape', None)
        name = ly.name if getattr(ly, 'is_input', False) else ly.layer.name
        if expected is not None and not first:
            raise ConfigError(f"{what}: layer '{name}' has an input_shape {expected}, but it is "
                              f"not the first layer: only the first one's is the samples' shape")
        if expected is not None and expected != shape:
            raise ConfigError(f"{what}: samples of shape {shape} do not match input_shape "
                              f"{expected} of layer '{name}'")
        first = getattr(ly, 'is_input', False)


# --- updating, saving and loading the interactive layers ---------------------------------------

class LayerUpdater:
    """SINGA's Updater::Update(step, param, grad_scale=1) for the interactive API: each param
    of a layer takes one step of `updater_proto`'s rule (singa.train.updater) with its gradient, its
    lr_scale and wd_scale; the rule's state (momentum history, ...) is kept per param."""

    def __init__(self, updater_proto):
        self.updater = create_updater(updater_proto)
        self.states = {}    # Param -> its state buffers

    def update(self, step, layer):
        """Update `layer`'s params in place at `step` (the learning-rate schedule's step); their
        grads are used as scratch; each param's version counts its updates."""
        for p in layer.params:
            state = self.states.get(p)
            if state is None:
                state = self.states[p] = self.updater.new_state(p.data.shape)
            self.updater.update(step, p.data, p.grad, state, p.lr_scale, p.wd_scale)
            p.version += 1


def save_model_parameter(step, fout, neuralnet):
    """Write the params of the layers `neuralnet` (data layers skipped; every other one must
    have run) to `<fout>/step<step>-worker0.bin`, SINGA's BlobProtos file, and return its path.
    Params are stored under the names a job's net gives them (`w1` as `0#w1`), so the file
    loads in a job's `checkpoint_path` as well as in load_model_parameter."""
    params = _stored_params(neuralnet, 'save_model_parameter')
    os.makedirs(fout, exist_ok=True)
    path = checkpoint.snapshot_file(fout, step, 0)
    checkpoint.write_file(path, [(name, p.data, p.version) for name, p in params.items()])
    return path


def load_model_parameter(fin, neuralnet, batchsize=1, data_shape=None):
    """Set up the layers `neuralnet` (a chain: leading data layers of batch shape `data_shape`,
    else (batchsize, ...) as an ImageInput knows it; each other layer reads the one before it
    or its `src`), then load every param found by name in checkpoint file `fin` (`.bin`
    optional; SINGA's `w1` and our `0#w1` names alike), values and versions. Returns {param
    name: files it came from}; params not in the file keep their initial values."""
    prev = None
    for ly in neuralnet:
        if ly.is_datalayer:
            if not isinstance(ly, Dummy):
                raise ConfigError(f"load_model_parameter: input layer '{ly.layer.name}' is no "
                                  f"Dummy, ImageInput or LabelInput, which the layers can read")
            shape = data_shape or ly.data_shape(batchsize)
            if shape is None and not ly.engines:
                raise ConfigError(f"load_model_parameter: give data_shape for input layer "
                                  f"'{ly.layer.name}'")
            ly.setup(shape)
        else:
            if prev is None and not ly.src:
                raise ConfigError(f"load_model_parameter: layer '{ly.layer.name}' has no "
                                  f"source layer")
            ly.setup(ly.src or [prev])
        prev = ly
    params = _stored_params(neuralnet, 'load_model_parameter')
    path = checkpoint.existing_file(fin)
    loaded = checkpoint.load_params([path], params, log=log.info)
    if params and not loaded:
        stored = checkpoint.CheckpointReader(path).names
        raise ConfigError(f"load_model_parameter: none of the layers' params "
                          f"({', '.join(list(params)[:4])}{', ...' if len(params) > 4 else ''}) "
                          f"is in {path}, which holds "
                          f"{', '.join(stored[:4]) or 'none'}{', ...' if len(stored) > 4 else ''}"
                          f": the names differ")
    return loaded


# --- helpers ------------------------------------------------------------------------------------

def _create(conf, rng):
    own = job_pb2.LayerProto()
    own.CopyFrom(conf)      # later changes to the builder's proto do not reach the engine
    engine = create_layer(own)
    engine.rng = rng
    return engine


def _take(par, role, changename, init, **kwargs):
    """The ParamProto a layer gets for `role` ('w' or 'b') from Parameter `par` (a new one of
    `init` if None): set_param_field applied to `par` itself, so the shortcuts stay with it for
    the next layer, but the name it gives kept for the layer's copy."""
    par = par or Parameter(init=init)
    name = par.param.name
    set_param_field(par.param, role, changename, **kwargs)
    taken = job_pb2.ParamProto()
    taken.CopyFrom(par.param)
    par.param.name = name
    return taken


def _stored_params(neuralnet, what):
    """{name in a checkpoint file: Param} of the non-data layers: `0#<name>`, the name of a
    job's (unrolled) param, unless the name has its `#` already."""
    params = {}
    for ly in neuralnet:
        if ly.is_datalayer:
            continue
        ly._ran(what)
        for p in ly.params:
            name = p.name if is_unrolled(p.name) else unrolled(p.name)
            if name in params:
                raise ConfigError(f"{what}: two params named '{p.name}' (layer "
                                  f"'{ly.layer.name}' and an earlier one)")
            params[name] = p
    return params


def _set_mask(ly, activation):
    """Give layer `ly` the activation LayerProto after it (`mask`): none for None and Keras'
    'linear'."""
    if activation is not None and activation != 'linear':
        ly.mask = Activation(activation=activation).layer


def _add_params(ly, changename, init, w_param, b_param, use_bias, kernel_initializer,
                bias_initializer, fans, exact, kwargs):
    """Append the weight and (with `use_bias`) the bias ParamProto to Dense or Convolution2D
    `ly`: from w_param/b_param, Keras' initializers (`fans`, `exact`: as
    `arguments.keras_param` takes them) or `init` (default: weight 'gaussian', bias
    'constant'), with the shortcuts in `kwargs`."""
    builder = type(ly).__name__
    for par, keras_name, keras_value in ((w_param, 'kernel_initializer', kernel_initializer),
                                         (b_param, 'bias_initializer', bias_initializer)):
        for name, value in (('init', init), ('w_param' if par is w_param else 'b_param', par)):
            if value is not None and keras_value is not None:
                raise ConfigError(f"{builder}: give {name} or {keras_name}, not both")
    w = arguments.keras_param(builder, 'kernel_initializer', kernel_initializer, fans,
                              exact) or w_param
    ly.layer.param.add().CopyFrom(_take(w, 'w', changename, init or 'gaussian', **kwargs))
    if not use_bias:
        given = [k for k, v in (('b_param', b_param), ('bias_initializer', bias_initializer))
                 if v is not None] + [k for k in kwargs if k.startswith('b_')]
        if given:
            raise ConfigError(f"{builder}: use_bias=False makes no bias; drop {given[0]}")
        return
    b = arguments.keras_param(builder, 'bias_initializer', bias_initializer) or b_param
    ly.layer.param.add().CopyFrom(_take(b, 'b', changename, init or 'constant', **kwargs))


