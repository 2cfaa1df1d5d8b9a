"""A Caffe deploy prototxt as a torch.nn module, to time our imported net against (bench_zoo.py).

  torch_net(prototxt, params)  a torch.nn.Module (eval mode) whose forward(x, keep=())
                               returns {blob name: tensor} of the last layer's top and the
                               blobs named in `keep` (an in-place layer's top is its
                               bottom's name, as in Caffe, so the last writer's value);
                               `params` maps a layer name to its blobs in Caffe's order
                               (numpy float32), copied in; or None without torch

Layers: Input, Convolution (group, dilation, bias_term), Pooling (MAX / AVE, Caffe's ceil
rounding, global_pooling), ReLU (negative_slope), LRN (ACROSS_CHANNELS:
x/(k + α/n·Σ x²)^β, torch's LocalResponseNorm), Concat, BatchNorm (global statistics:
(x − S_μ/s)/√(S_σ²/s + ε)) and Scale, Eltwise (SUM with coeff, PROD, MAX), InnerProduct,
Dropout (identity), Softmax, Flatten. Anything else raises ValueError naming the layer.
"""
import numpy as np

from singa.interop.caffe import netdef


def _pair(p, name, default):
    """Caffe's (h, w) of a conv/pool knob ("kernel", "pad", "stride"): name_h/name_w if set,
    else the repeated or single field (kernel_size for the kernel), else default."""
    if p.HasField(name + "_h"):
        return getattr(p, name + "_h"), getattr(p, name + "_w")
    name = "kernel_size" if name == "kernel" else name
    v = getattr(p, name)
    if isinstance(v, int):
        return (v, v) if p.HasField(name) else (default, default)
    v = list(v) or [default]
    return (v[0], v[-1])


def torch_net(prototxt, params):
    try:
        import torch
    except ImportError:
        return None
    nn, F = torch.nn, torch.nn.functional
    net = netdef.read_net(prototxt)

    def tensor(a, shape=None):
        t = torch.from_numpy(np.array(a, np.float32, copy=True))
        return t if shape is None else t.reshape(shape)

    class Scale(nn.Module):
        def __init__(self, gamma, beta):
            super().__init__()
            self.gamma = nn.Parameter(tensor(gamma, (1, -1, 1, 1)), requires_grad=False)
            self.beta = None if beta is None else \
                nn.Parameter(tensor(beta, (1, -1, 1, 1)), requires_grad=False)

        def forward(self, x):
            return torch.addcmul(self.beta, x, self.gamma) if self.beta is not None \
                else x * self.gamma

    class Lambda(nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, *xs):
            return self.fn(*xs)

    def module(layer, shapes):
        kind, blobs = layer.type, params.get(layer.name, [])
        if kind == "Convolution":
            p = layer.convolution_param
            kernel, stride = _pair(p, "kernel", 1), _pair(p, "stride", 1)
            pad, dil = _pair(p, "pad", 0), tuple(list(p.dilation)[:1] * 2 or (1, 1))
            c = shapes[0][1]
            m = nn.Conv2d(c, p.num_output, kernel, stride, pad, dil, p.group, p.bias_term)
            m.weight.data = tensor(blobs[0], m.weight.shape)
            if p.bias_term:
                m.bias.data = tensor(blobs[1])
            return m
        if kind == "Pooling":
            p = layer.pooling_param
            if p.global_pooling:
                pool = F.adaptive_max_pool2d if p.pool == p.MAX else F.adaptive_avg_pool2d
                return Lambda(lambda x: pool(x, 1))
            kernel, stride, pad = _pair(p, "kernel", 1), _pair(p, "stride", 1), _pair(p, "pad", 0)
            if p.pool == p.MAX:
                return nn.MaxPool2d(kernel, stride, pad, ceil_mode=True)
            return nn.AvgPool2d(kernel, stride, pad, ceil_mode=True, count_include_pad=True)
        if kind == "ReLU":
            slope = layer.relu_param.negative_slope
            return nn.LeakyReLU(slope) if slope else nn.ReLU()
        if kind == "LRN":
            p = layer.lrn_param
            if p.norm_region != p.ACROSS_CHANNELS:
                raise ValueError(f"{prototxt}: layer '{layer.name}': LRN WITHIN_CHANNEL")
            return nn.LocalResponseNorm(p.local_size, p.alpha, p.beta, p.k)
        if kind == "Concat":
            axis = layer.concat_param.axis
            return Lambda(lambda *xs: torch.cat(xs, axis))
        if kind == "BatchNorm":
            s = float(blobs[2][0])
            s = 0.0 if s == 0 else 1.0 / s
            m = nn.BatchNorm2d(shapes[0][1], layer.batch_norm_param.eps, affine=False)
            m.running_mean.data = tensor(blobs[0]) * s
            m.running_var.data = tensor(blobs[1]) * s
            return m
        if kind == "Scale":
            return Scale(blobs[0], blobs[1] if layer.scale_param.bias_term else None)
        if kind == "Eltwise":
            p = layer.eltwise_param
            if p.operation == p.PROD:
                return Lambda(lambda *xs: torch.stack(xs).prod(0))
            if p.operation == p.MAX:
                return Lambda(lambda *xs: torch.stack(xs).amax(0))
            coeff = list(p.coeff) or [1.0] * len(layer.bottom)
            if all(c == 1 for c in coeff):
                return Lambda(lambda *xs: sum(xs[1:], xs[0]))
            return Lambda(lambda *xs: sum(c * x for c, x in zip(coeff, xs)))
        if kind == "InnerProduct":
            p = layer.inner_product_param
            m = nn.Linear(int(np.prod(shapes[0][1:])), p.num_output, p.bias_term)
            m.weight.data = tensor(blobs[0], m.weight.shape)
            if p.bias_term:
                m.bias.data = tensor(blobs[1])
            return nn.Sequential(nn.Flatten(), m)
        if kind == "Dropout":
            return nn.Identity()
        if kind == "Softmax":
            return nn.Softmax(layer.softmax_param.axis)
        if kind == "Flatten":
            return nn.Flatten(layer.flatten_param.axis)
        raise ValueError(f"{prototxt}: layer '{layer.name}' of type {kind}: not translated")

    class Net(nn.Module):
        """The layers in order over a dict of blobs."""

        def __init__(self):
            super().__init__()
            self.steps, self.mods, self.inputs = [], nn.ModuleList(), []
            shapes = {}
            for layer in net.layer:
                if layer.type == "Input":
                    self.inputs.append(layer.top[0])
                    shapes[layer.top[0]] = tuple(layer.input_param.shape[0].dim)
                    continue
                m = module(layer, [shapes[b] for b in layer.bottom])
                self.mods.append(m)
                self.steps.append((layer.bottom, layer.top[0]))
                with torch.no_grad():       # Caffe's shapes, from a sample of one
                    ins = [torch.zeros((1,) + shapes[b][1:]) for b in layer.bottom]
                    shapes[layer.top[0]] = (shapes[layer.bottom[0]][0],) + \
                        tuple(m.eval()(*ins).shape[1:])
            self.eval()

        def forward(self, x, keep=()):
            """{name: blob} of the blobs in `keep` and of the last layer's top; a blob is
            dropped after its last reader, as a plain torch model's locals are."""
            blobs, last = {self.inputs[0]: x}, {}
            for i, (bottoms, _) in enumerate(self.steps):
                last.update((b, i) for b in bottoms)
            for i, (m, (bottoms, top)) in enumerate(zip(self.mods, self.steps)):
                y = m(*(blobs[b] for b in bottoms))
                for b in bottoms:
                    if last[b] == i and b not in keep:
                        del blobs[b]
                blobs[top] = y
            return blobs

    return Net()
