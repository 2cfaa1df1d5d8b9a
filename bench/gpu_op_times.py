"""Bench on a GPU: where a training step's device time goes, operation by operation (no
reference).

    python bench/gpu_op_times.py [--nets mlp,lenet,cifar10] [--batch 1024] [--steps 4] [--top 6]

For each net (bench_mlp_step's MLP, bench_conv's LeNet and cifar10 net, with `gpu: 0`, the
full runtime as in bench_gpu.py, op by op: no CUDA graphs), CUDA events around each layer's
forward and backward pass and around each device operation in it: every numpy function or
ufunc the layer modules (and `singa.device.threads`) call on device arrays, and each of our kernels
(`singa.layers.kernels.cuda`), named by what was called. The GPU's time between an operation's two
events is its own where the GPU is the bottleneck (at batch 1024; at small batches it takes
in the host's gaps). Operators on CuPy arrays (`a += b`) and calls the layers make to CuPy
directly are not wrapped: a pass's time beyond its operations' is "not wrapped". Prints, per
net, each layer's passes with their `--top` costliest operations, then the operations summed
over the step. ms per step, the mean of `--steps` steps after 3 unmeasured.

Then the references on the same shapes, each timed alone (`--reps` calls, waited for at the
end): every matrix product of the step (np.matmul, its operands' shapes and layouts) by CuPy
and by torch, both in float32: what cuBLAS gives each library on our shapes; and each
convolution layer's forward and backward by torch's cuDNN (F.conv2d and its gradients), in
float32 and in TF32 (torch's default), against ours' passes above: what cuDNN would save.
"""
import argparse
import importlib
import shutil
import sys
import tempfile
import time
from collections import defaultdict

import singa  # noqa: F401  (first: it picks OpenBLAS's kernels before numpy loads it)
import numpy as np

import bench_conv
from bench_gpu import job_of
from bench_mlp_step import Runtime, print_table

#: the modules whose `np` calls are timed, and whose kernels (`_launch`) are
NP_MODULES = ["singa.device.threads", "singa.layers.base", "singa.layers.conv",
              "singa.layers.pooling", "singa.layers.neuron", "singa.layers.loss",
              "singa.layers.norm", "singa.layers.input", "singa.layers.output",
              "singa.layers.connection", "singa.layers.ops", "singa.layers.kernels.numpy"]
PASS = "(pass)"


def on_device(values):
    return any(hasattr(v, "__cuda_array_interface__") or
               isinstance(v, (list, tuple)) and on_device(v) for v in values)


class Recorder:
    """Events around the wrapped calls: `pending` (key, start, end), summed by `settle`."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.where = ("(outside a pass)", "")
        self.pending = []
        self.total = defaultdict(float)     # (layer, pass, op) -> ms
        self.count = defaultdict(int)
        self.products = defaultdict(int)     # layouts of np.matmul's operands -> calls

    def timed(self, label, fn, where=None):
        """`fn` with events around it: an operation `label` of the pass it runs in, or with
        `where` = (layer, pass), that pass itself."""
        def call(*args, **kwargs):
            if where is None and not on_device(list(args) + list(kwargs.values())):
                return fn(*args, **kwargs)
            if label == "np.matmul":
                self.products[tuple(layout(v) for v in (*args[:2], kwargs.get("out")))] += 1
            start, end = self.cupy.cuda.Event(), self.cupy.cuda.Event()
            outer = self.where
            key = outer + (label,) if where is None else where + (PASS,)
            if where is not None:
                self.where = where
            start.record()
            try:
                return fn(*args, **kwargs)
            finally:
                end.record()
                self.where = outer
                self.pending.append((key, start, end))
        return call

    def settle(self):
        """Wait for the GPU; add the recorded intervals to the totals."""
        self.cupy.cuda.get_current_stream().synchronize()
        for key, start, end in self.pending:
            self.total[key] += self.cupy.cuda.get_elapsed_time(start, end)
            self.count[key] += 1
        self.pending.clear()


class TimedModule:
    """`module` (numpy) whose callables are timed by `recorder` where a device array is
    among the arguments."""

    def __init__(self, module, recorder):
        self._module, self._recorder, self._made = module, recorder, {}

    def __getattr__(self, name):
        v = getattr(self._module, name)
        if not callable(v) or isinstance(v, type):
            return v
        made = self._made.get(name)
        if made is None:
            made = self._made[name] = self._recorder.timed(f"np.{name}", v)
        return made


def instrument(rt, recorder):
    """Wrap the layer modules' numpy, our kernels' launches and rt's layers' passes; returns
    what undoes it."""
    modules = [importlib.import_module(name) for name in NP_MODULES]
    for module in modules:
        module.np = TimedModule(np, recorder)
    cuda = importlib.import_module("singa.layers.kernels.cuda")
    launch = cuda._launch
    cuda._launch = lambda kernel, *a: recorder.timed(f"kernel {kernel}", launch)(kernel, *a)
    for layer in rt.worker.train_net.layers:
        layer.compute_feature = recorder.timed("", layer.compute_feature, (layer.name, "fwd"))
        layer.compute_gradient = recorder.timed("", layer.compute_gradient, (layer.name, "bwd"))

    def undo():
        for module in modules:
            module.np = np
        cuda._launch = launch
    return undo


def layout(a):
    """(shape, axes by falling stride) of array `a`, None for None: `a` as a transposed
    contiguous array."""
    if a is None:
        return None
    return tuple(a.shape), tuple(sorted(range(a.ndim), key=lambda i: -a.strides[i]))


def made(empty, transpose, spec):
    """An array of `spec` (`layout`'s) from `empty(shape)`, `transpose(array, axes)`."""
    if spec is None:
        return None
    shape, order = spec
    return transpose(empty(tuple(shape[i] for i in order)), tuple(map(order.index,
                                                                         range(len(order)))))


def seconds(fn, sync, reps):
    """Seconds a call of `fn`, over `reps` calls after one, waited for (`sync`) at the end."""
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - start) / reps


def cupy_sync():
    import cupy
    return cupy.cuda.get_current_stream().synchronize


def torch_sync(device):
    import torch
    return torch.cuda.synchronize if device == "cuda" else lambda: None


def product_references(products, reps, device="cuda"):
    """Rows: each product of the step, CuPy's ms and torch's (float32) on the same layouts."""
    import cupy
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []

    def transpose(v, axes):
        return v.transpose(axes)
    for spec, calls in sorted(products.items(), key=lambda kv: -kv[1]):
        a, b, out = (made(lambda shape: cupy.ones(shape, np.float32), transpose, s) for s in spec)
        ta, tb, tout = (made(lambda shape: torch.ones(shape, device=device), torch.permute, s)
                        for s in spec)
        tout = tout if tout is not None and tout.is_contiguous() else None
        shapes = " x ".join(f"{spec[i][0]}{'' if spec[i][1] == tuple(sorted(spec[i][1])) else 'T'}"
                            for i in range(2))
        try:
            ours = seconds(lambda: np.matmul(a, b, out=out), cupy_sync(), reps)
            theirs = seconds(lambda: torch.matmul(ta, tb, out=tout), torch_sync(device), reps)
        except Exception as e:      # a reference that fails costs its row only
            rows.append([shapes, f"{calls:g}", f"failed: {type(e).__name__}: {e}"[:80], "", ""])
            continue
        rows.append([shapes, f"{calls:g}", f"{ours * 1e3:.3f}", f"{theirs * 1e3:.3f}",
                     f"{ours / theirs:.2f}"])
    return rows


def conv_references(convs, reps, device="cuda"):
    """Rows: each convolution layer's forward and backward by torch (cuDNN), float32 and
    TF32, in ms; `convs` (name, layer, whether its source takes a gradient)."""
    import torch
    import torch.nn.functional as F
    rows = []
    for name, layer, gx in convs:
        n, f, sync = *layer.data.shape[:2], torch_sync(device)
        x = torch.rand((n,) + layer.chw, device=device, requires_grad=gx)
        w = torch.rand((f, layer.chw[0] // layer.group) + layer.kernel, device=device,
                       requires_grad=True)
        b = torch.rand(f, device=device, requires_grad=True)
        gy = torch.rand(tuple(layer.data.shape), device=device)
        wrt = [x, w, b] if gx else [w, b]

        def forward():
            return F.conv2d(x, w, b, layer.stride, layer.pad, 1, layer.group)

        def both():
            torch.autograd.grad(forward(), wrt, gy)
        row = [name]
        try:
            for tf32 in (False, True):
                torch.backends.cudnn.allow_tf32 = tf32
                fwd = seconds(forward, sync, reps)
                row += [f"{fwd * 1e3:.3f}", f"{(seconds(both, sync, reps) - fwd) * 1e3:.3f}"]
        except Exception as e:      # as above
            row.append(f"failed: {type(e).__name__}: {e}"[:80])
        rows.append(row)
    return rows


def measure(net, batch, steps):
    """{(layer, pass, op): ms per step}, {key: calls per step}, {np.matmul's operand layouts:
    calls per step} and the convolution layers [(name, layer, gradient wanted)] of `net` at
    `batch`."""
    import cupy
    folder = tempfile.mkdtemp(prefix=f"singa-gpu-op-times-{net}-")
    try:
        rt = Runtime(job_of(net, folder, batch, True))
        try:
            rt.worker.device.use()
            rt.worker.graphs.capture = False
            recorder = Recorder(cupy)
            undo = instrument(rt, recorder)
            for _ in range(3):
                rt.train_step()
            recorder.settle()
            recorder.total.clear()
            recorder.count.clear()
            for _ in range(steps):
                rt.train_step()
                recorder.settle()
            train = rt.worker.train_net
            convs = [(layer.name, layer, train.srclayers[layer.name][0].grad_for(layer) is not None)
                     for layer in train.layers if type(layer).__name__ == "ConvolutionLayer"]
            return ({k: v / steps for k, v in recorder.total.items()},
                    {k: v / steps for k, v in recorder.count.items()},
                    {k: v / (steps + 3) for k, v in recorder.products.items()}, convs)
        finally:
            undo()
            rt.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def report(net, batch, total, count, top):
    passes = [k for k in total if k[2] == PASS]
    rows, by_op = [], defaultdict(float)
    for layer, side, _ in passes:
        ops = sorted(((k[2], v, count[k]) for k, v in total.items()
                      if k[:2] == (layer, side) and k[2] != PASS), key=lambda t: -t[1])
        own = total[(layer, side, PASS)]
        rows.append([f"{layer} {side}", f"{own:.3f}", "", ""])
        for op, ms, n in ops[:top]:
            rows.append([f"  {op}", "", f"{ms:.3f}", f"{n:g}"])
        wrapped = sum(ms for _, ms, _ in ops)
        rows.append(["  not wrapped", "", f"{own - wrapped:.3f}", ""])
        for op, ms, _ in ops:
            by_op[op] += ms
    step = sum(total[k] for k in passes)
    print(f"{net} on GPU 0, batch {batch}: device ms per step, forward and backward "
          f"{step:.3f} ms")
    print_table(rows, ["layer pass / operation", "pass ms", "op ms", "calls"])
    print()
    print_table([[op, f"{ms:.3f}", f"{100 * ms / step:.0f}%"]
                 for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1])],
                ["operation, over the step", "ms", "of forward and backward"])
    print()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="mlp,lenet,cifar10")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    for net in args.nets.split(","):
        total, count, products, convs = measure(net, args.batch, args.steps)
        report(net, args.batch, total, count, args.top)
        print(f"{net}, batch {args.batch}: its products alone, ms a call (float32)")
        print_table(product_references(products, args.reps),
                    ["a x b (T: transposed)", "calls a step", "CuPy", "torch", "CuPy/torch"])
        if convs:
            print(f"\n{net}, batch {args.batch}: its convolutions by torch (cuDNN), ms "
                  f"(ours: the passes above)")
            print_table(conv_references(convs, args.reps),
                        ["layer", "fwd float32", "bwd float32", "fwd TF32", "bwd TF32"])
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
