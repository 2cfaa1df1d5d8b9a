"""Reference training steps of SINGA's MNIST MLP, to time ours against in the same run.

The net of examples/mnist/job.conf: InnerProduct 784-2500-2000-1500-1000-500-10, scaled tanh
f(z) = 1.7159047 tanh(0.66666667 z) between them, softmax loss, plain SGD.

  numpy_step(batch)  a zero-argument callable: one forward + backward + SGD step in hand-written
                     numpy, the floor a numpy framework can reach
  torch_step(batch, device="cpu", sync=True)  the same step in PyTorch on `device` ("cuda":
                     eager, synchronised at its end unless not `sync`), or None when torch is
                     not installed
  gemm_roofline()    the best float32 GEMM rate (FLOP/s) numpy reaches here
  flops_per_step(b)  FLOPs of a step's GEMMs (three per layer)

`python bench/mlp_reference.py [batch]` prints the figures.
"""
import sys
import time

import numpy as np

SIZES = (784, 2500, 2000, 1500, 1000, 500, 10)
OUTER, INNER = 1.7159047, 0.66666667    # STanh: OUTER * tanh(INNER * z)


def hidden(width):
    """SIZES with every hidden layer `width` units wide (SIZES itself for None)."""
    return SIZES if width is None else (SIZES[0],) + (width,) * (len(SIZES) - 2) + (SIZES[-1],)


def flops_per_step(batch, sizes=SIZES):
    return sum(6 * batch * fan_in * fan_out for fan_in, fan_out in zip(sizes, sizes[1:]))


def median_seconds(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def gemm_roofline():
    best = 0.0
    for m, k, n in ((64, 784, 2500), (64, 2500, 2000), (2500, 64, 2000), (1024, 1024, 1024)):
        a = np.random.rand(m, k).astype(np.float32)
        b = np.random.rand(k, n).astype(np.float32)
        best = max(best, 2 * m * k * n / median_seconds(lambda: a @ b, reps=30))
    return best


def numpy_step(batch=64, lr=0.001, seed=0, sizes=SIZES):
    rng = np.random.default_rng(seed)
    weights = [rng.uniform(-0.05, 0.05, (o, i)).astype(np.float32) for i, o in zip(sizes, sizes[1:])]
    biases = [np.zeros(o, np.float32) for o in sizes[1:]]
    x = rng.random((batch, sizes[0]), dtype=np.float32)
    labels = rng.integers(0, sizes[-1], batch)
    rows = np.arange(batch)
    last = len(weights) - 1

    def step():
        outputs = [x]
        for l, (w, b) in enumerate(zip(weights, biases)):
            z = outputs[-1] @ w.T + b
            outputs.append(OUTER * np.tanh(INNER * z) if l < last else z)
        p = np.exp(outputs[-1] - outputs[-1].max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[rows, labels] -= 1
        grad = p / batch
        for l in range(last, -1, -1):
            grad_w, grad_b = grad.T @ outputs[l], grad.sum(axis=0)
            if l > 0:   # d STanh / dz, written with the layer's output h: INNER * (OUTER - h^2 / OUTER)
                h = outputs[l]
                grad = (grad @ weights[l]) * (INNER * OUTER - (INNER / OUTER) * h * h)
            weights[l] -= lr * grad_w
            biases[l] -= lr * grad_b

    return step


def torch_step(batch=64, lr=0.001, seed=0, device="cpu", sizes=SIZES, sync=True):
    try:
        import torch
    except ImportError:
        return None
    torch.manual_seed(seed)

    class STanh(torch.nn.Module):
        def forward(self, z):
            return OUTER * torch.tanh(INNER * z)

    modules = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        modules += [torch.nn.Linear(fan_in, fan_out), STanh()]
    net = torch.nn.Sequential(*modules[:-1]).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    x = torch.rand(batch, sizes[0], device=device)
    labels = torch.randint(0, sizes[-1], (batch,), device=device)
    loss = torch.nn.CrossEntropyLoss()
    return torch_stepper(torch, net, opt, loss, x, labels, device, sync)


def torch_stepper(torch, net, opt, loss, x, labels, device, sync=True):
    """One SGD step of `net` on (x, labels), synchronised with the device at its end (with
    `sync`; else only queued)."""
    def step():
        opt.zero_grad()
        loss(net(x), labels).backward()
        opt.step()
        if sync and device != "cpu":
            torch.cuda.synchronize()

    return step


if __name__ == "__main__":
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    roof, flops = gemm_roofline(), flops_per_step(batch)
    t_numpy = median_seconds(numpy_step(batch))
    print(f"batch {batch}: GEMM roofline {roof / 1e9:.1f} GFLOP/s, step {flops / 1e9:.3f} GFLOP, "
          f"floor {flops / roof * 1e3:.2f} ms")
    print(f"plain numpy step {t_numpy * 1e3:.2f} ms ({flops / t_numpy / roof:.0%} of roofline)")
    step = torch_step(batch)
    if step is not None:
        t_torch = median_seconds(step)
        print(f"torch cpu step   {t_torch * 1e3:.2f} ms ({flops / t_torch / roof:.0%} of roofline); "
              f"numpy/torch = {t_numpy / t_torch:.2f}")
