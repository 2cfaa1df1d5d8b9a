"""Reference training steps of SINGA's convolution nets, to time ours against in the same run.

  LENET    examples/mnist/conv.conf: conv 20@5x5, max-pool 2/2, conv 50@5x5, max-pool 2/2,
           ip 500, relu, ip 10 on (N, 1, 28, 28)
  CIFAR10  SINGA's examples/cifar10/job.conf: conv 32@5x5 pad 2, max-pool 3/2, relu,
           lrn 3, conv 32@5x5 pad 2, relu, avg-pool 3/2, lrn 3, conv 64@5x5 pad 2, relu,
           avg-pool 3/2, ip 10 on (N, 3, 32, 32)

  numpy_step(net, batch)  a zero-argument callable: forward + backward + SGD in plain numpy
                          (im2col by a strided view, one GEMM per conv and direction)
  torch_step(net, batch, device="cpu", sync=True)  the same step in PyTorch on `device`
                          ("cuda": eager, synchronised at its end unless not `sync`), or None
                          without torch

A net is a list of ("conv", filters, kernel, pad), ("pool", "max"|"avg", kernel, stride),
("relu",), ("lrn", n, alpha, beta), ("ip", outputs). LRN is SINGA's (src/neuralnet/
neuron_layer/lrn.cc), y = x·(1 + α/n·Σ x² over the n channels centred on c)^−β, which is
torch's LocalResponseNorm. Pooling output sizes are floor((H - k)/s) + 1, as Caffe's with
SINGA's confs (no padding).
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from mlp_reference import torch_stepper

LENET = (1, 28, 28), [("conv", 20, 5, 0), ("pool", "max", 2, 2), ("conv", 50, 5, 0),
                      ("pool", "max", 2, 2), ("ip", 500), ("relu",), ("ip", 10)]
CIFAR10 = (3, 32, 32), [("conv", 32, 5, 2), ("pool", "max", 3, 2), ("relu",),
                        ("lrn", 3, 5e-05, 0.75), ("conv", 32, 5, 2), ("relu",),
                        ("pool", "avg", 3, 2), ("lrn", 3, 5e-05, 0.75), ("conv", 64, 5, 2),
                        ("relu",), ("pool", "avg", 3, 2), ("ip", 10)]
NETS = {"lenet": LENET, "cifar10": CIFAR10}


def _pool_windows(x, k, s):
    """(N, C, OH, OW, k, k) strided view of the windows of x."""
    return sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::s, ::s]


def _channel_window_sum(a, size):
    """Σ of a over the `size` channels centred on each channel (zero outside), (N, C, H, W)."""
    half = size // 2
    padded = np.pad(a, ((0, 0), (half, half), (0, 0), (0, 0)))
    return sum(padded[:, i:i + a.shape[1]] for i in range(size))


def numpy_step(net, batch, lr=0.001, seed=0):
    shape, layers = NETS[net]
    rng = np.random.default_rng(seed)
    x0 = rng.random((batch,) + shape, dtype=np.float32)
    labels = rng.integers(0, 10, batch)
    params, chw = [], shape
    for spec in layers:     # weights in SINGA's layout: conv (F, C*k*k), ip (out, in)
        if spec[0] == "conv":
            _, f, k, p = spec
            params.append([rng.normal(0, 0.01, (f, chw[0] * k * k)).astype(np.float32),
                           np.zeros(f, np.float32)])
            chw = (f, chw[1] + 2 * p - k + 1, chw[2] + 2 * p - k + 1)
        elif spec[0] == "pool":
            k, s = spec[2:]
            chw = (chw[0], (chw[1] - k) // s + 1, (chw[2] - k) // s + 1)
            params.append(None)
        elif spec[0] == "ip":
            fan_in = int(np.prod(chw))
            params.append([rng.normal(0, 0.01, (spec[1], fan_in)).astype(np.float32),
                           np.zeros(spec[1], np.float32)])
            chw = (spec[1],)
        else:
            params.append(None)

    def step():
        xs, caches = [x0], []
        for spec, pw in zip(layers, params):
            x = xs[-1]
            if spec[0] == "conv":
                _, f, k, p = spec
                xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p))) if p else x
                n, c = xp.shape[:2]
                oh, ow = xp.shape[2] - k + 1, xp.shape[3] - k + 1
                # (C, k, k, N, OH, OW) so that one GEMM serves the whole batch
                col = sliding_window_view(xp, (k, k), axis=(2, 3)).transpose(1, 4, 5, 0, 2, 3)
                col = np.ascontiguousarray(col).reshape(c * k * k, -1)
                y = (pw[0] @ col).reshape(f, n, oh, ow).transpose(1, 0, 2, 3) + pw[1][:, None, None]
                caches.append((col, xp.shape))
            elif spec[0] == "pool":
                win = _pool_windows(x, spec[2], spec[3])
                y = win.max(axis=(4, 5)) if spec[1] == "max" else win.mean(axis=(4, 5))
                caches.append(None)
            elif spec[0] == "ip":
                y = x.reshape(len(x), -1) @ pw[0].T + pw[1]
                caches.append(None)
            elif spec[0] == "lrn":
                _, size, alpha, beta = spec
                norm = 1 + alpha / size * _channel_window_sum(x * x, size)
                y = x * norm ** -beta
                caches.append(norm)
            else:
                y = np.maximum(x, 0)
                caches.append(None)
            xs.append(np.ascontiguousarray(y))
        prob = np.exp(xs[-1] - xs[-1].max(axis=1, keepdims=True))
        prob /= prob.sum(axis=1, keepdims=True)
        prob[np.arange(batch), labels] -= 1
        g = prob / batch
        for i in range(len(layers) - 1, -1, -1):
            spec, pw, x, y = layers[i], params[i], xs[i], xs[i + 1]
            if spec[0] == "conv":
                _, f, k, p = spec
                col, pshape = caches[i]
                n, c, hp, wp = pshape
                g2 = g.transpose(1, 0, 2, 3).reshape(f, -1)
                gw, gb = g2 @ col.T, g2.sum(axis=1)
                if i > 0:
                    gcol = (pw[0].T @ g2).reshape(c, k, k, n, y.shape[2], y.shape[3])
                    gxp = np.zeros((n, c, hp, wp), np.float32)
                    for a in range(k):
                        for b in range(k):
                            gxp[:, :, a:a + y.shape[2], b:b + y.shape[3]] += \
                                gcol[:, a, b].transpose(1, 0, 2, 3)
                    g = gxp[:, :, p:hp - p, p:wp - p] if p else gxp
                pw[0] -= lr * gw
                pw[1] -= lr * gb
            elif spec[0] == "pool":
                k, s = spec[2:]
                gx = np.zeros_like(x)
                oh, ow = y.shape[2:]
                for a in range(k):
                    for b in range(k):
                        rows, cols = slice(a, a + s * (oh - 1) + 1, s), slice(b, b + s * (ow - 1) + 1, s)
                        if spec[1] == "max":
                            gx[:, :, rows, cols] += g * (x[:, :, rows, cols] == y)
                        else:
                            gx[:, :, rows, cols] += g / (k * k)
                g = gx
            elif spec[0] == "lrn":
                _, size, alpha, beta = spec
                norm = caches[i]
                scale = norm ** -beta
                g = g * scale - 2 * alpha * beta / size * x * \
                    _channel_window_sum(g * x * scale / norm, size)
            elif spec[0] == "ip":
                g2 = g.reshape(len(g), -1)
                gw, gb = g2.T @ x.reshape(len(x), -1), g2.sum(axis=0)
                g = (g2 @ pw[0]).reshape(x.shape)
                pw[0] -= lr * gw
                pw[1] -= lr * gb
            else:
                g = g * (x > 0)

    return step


def torch_step(net, batch, lr=0.001, seed=0, device="cpu", sync=True):
    try:
        import torch
    except ImportError:
        return None
    torch.manual_seed(seed)
    shape, layers = NETS[net]
    modules, chw = [], shape
    for spec in layers:
        if spec[0] == "conv":
            _, f, k, p = spec
            modules.append(torch.nn.Conv2d(chw[0], f, k, padding=p))
            chw = (f, chw[1] + 2 * p - k + 1, chw[2] + 2 * p - k + 1)
        elif spec[0] == "pool":
            k, s = spec[2:]
            modules.append((torch.nn.MaxPool2d if spec[1] == "max" else torch.nn.AvgPool2d)(k, s))
            chw = (chw[0], (chw[1] - k) // s + 1, (chw[2] - k) // s + 1)
        elif spec[0] == "ip":
            if len(chw) > 1:
                modules.append(torch.nn.Flatten())
            modules.append(torch.nn.Linear(int(np.prod(chw)), spec[1]))
            chw = (spec[1],)
        elif spec[0] == "lrn":
            modules.append(torch.nn.LocalResponseNorm(spec[1], spec[2], spec[3], k=1.0))
        else:
            modules.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*modules).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x = torch.rand((batch,) + shape, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)
    return torch_stepper(torch, model, opt, torch.nn.CrossEntropyLoss(), x, labels, device,
                         sync)
