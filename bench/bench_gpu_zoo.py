"""Bench: a training step of the Caffe zoo nets imported by ours on one GPU against PyTorch there.

    python bench/bench_gpu_zoo.py [--nets resnet50,googlenet,vgg16,mobilenet] [--batches 128,32]
                                  [--rounds 3] [--steps 3] [--warmup 2] [--device gpu|cpu]
                                  [--cpu-threads 2]

Nets: ResNet-50, GoogLeNet, VGG-16 and MobileNet v1, each imported from its deploy prototxt
(bench_zoo.NETS) by `import_caffe` and made a kTrain job: its input a kDummy layer
(`deploy.deploy_net`) fed one batch of U[0,1) pixels once, its last layer (Softmax) a
SoftmaxLoss on the scores with the labels of a second kDummy layer fed random classes, SGD
(lr 0.01 times each param's lr_scale from the importer, momentum 0.9, no weight decay). The
params hold bench_zoo's values (`seed_params`), Put to the servers again. BatchNorm keeps the
deploy's global statistics (use_global_stats, not learned), torch's in eval mode.
Ours: `runtime.Process` with `gpu: 0` (bench_mlp_step.Runtime), a step `train_one_batch` then
`collect_all` (forward, backward, the gradients to the server, its SGD update on the GPU, the
values back), waited for at its end: the runtime path bench_gpu.py times. Torch:
zoo_reference's modules (Dropout a training torch.nn.Dropout), cross-entropy on the scores,
torch.optim.SGD with our lr per param, synchronised at the end of each step; in float32
(cudnn.allow_tf32 and cuda.matmul.allow_tf32 off), and in column "TF32" with both on (torch's
convolutions' default: products of 10-bit mantissas on the tensor cores).
Checked first, from the same values and batch (float32, Dropout off): the loss at step 0 and
the classifier's weight gradient within 1e-3 of torch's (relative), the first convolution's
weight gradient and the loss's change by one update (through the runtime) within 5e-2
(max pooling: see POOLED_TOLERANCE); a net that fails is not timed, and the bench exits 1
once the others ran. Then interleaved rounds (bench_mlp_step.interleaved, after 2 warm-up
steps a side: ours, torch, torch TF32, ours ...), medians.
Memory, from before a net is built to the end of the check and 3 more steps: ours, the
high-water mark of the bytes in use in CuPy's default pool (its every malloc watched,
cupy.cuda.set_allocator, in whichever thread) plus what the pool of its CUDA graphs holds;
torch's `max_memory_allocated` after `reset_peak_memory_stats` (`max_memory_reserved` beside).
Neither counts the CUDA context or cuBLAS's own workspace.
Goals (issue 47): ours/torch float32 <= 1.2 at batch 128; ours' device memory <= 1.3x torch's.
Exits 0 whatever the ratios. --device cpu: the same code with our CPU device and torch on the
CPU, at batch 2, one round of one step, no warm-up (the checks and the path without a GPU;
no memory, no TF32).
"""
import argparse
import collections
import contextlib
import gc
import os
import shutil
import sys
import tempfile
import time
import traceback
import types

import singa  # noqa: F401  (first: it picks OpenBLAS's kernels before numpy loads it)
import numpy as np
from google.protobuf import text_format

import bench_zoo
import zoo_reference
from bench_gpu import compute_only, print_gpu_engine, synced
from bench_mlp_step import Runtime, interleaved, print_table
from singa.device import assign, host_copy, threads
from singa.interop import deploy
from singa.interop.caffe import netdef
from singa.interop.caffe.importer import import_caffe
from singa.job import config
from singa.proto import job_pb2

GOAL_TIME, GOAL_BATCH, GOAL_MEMORY = 1.2, 128, 1.3
TOLERANCE = bench_zoo.TOLERANCE
#: below a max pooling: a window's gradient goes to its largest input, and where two inputs
#: are within float32's rounding of each other ours and torch (other summation orders) may
#: pick different ones. VGG-16 at batch 2 on the CPU: 4 such windows in pool4 (of 800 k)
#: put conv1_1's weight gradient 0.8% (max-normalised) from torch's and the loss's change by
#: an update 0.09%, every layer above pool4 within 4e-6 (the classifier's gradient and the
#: loss keep TOLERANCE).
POOLED_TOLERANCE = 5e-2
LR, MOMENTUM = 0.01, 0.9
#: train steps after the check's one, the rest of what memory is measured over (the CUDA
#: graphs are captured in the third step: cuda_graphs.WARMUP)
MEMORY_STEPS = 3
#: the kDummy layer that gives the SoftmaxLoss its labels
LABELS = "bench_labels"
MB = 1e6


def zoo_job(name, workspace, batch, gpu):
    """The kTrain job of zoo net `name` at `batch` in `workspace` (see the docstring)."""
    conf = import_caffe(bench_zoo.NETS[name], workspace, print=lambda *a: None)
    job = config.load_job(conf, check_paths=False)
    net = deploy.deploy_net(job.neuralnet, conf)
    for layer in net.layer:
        if layer.type == job_pb2.kDummy:
            layer.dummy_conf.shape[0] = batch
    last = net.layer[-1]
    if last.type != job_pb2.kSoftmax:
        raise ValueError(f"the last layer '{last.name}' is not a Softmax")
    labels = net.layer.add(name=LABELS, type=job_pb2.kDummy)
    labels.dummy_conf.input = True
    labels.dummy_conf.shape.extend([batch, 1])
    last.type = job_pb2.kSoftmaxLoss
    last.ClearField("softmax_conf")
    last.srclayers.append(LABELS)
    job.neuralnet.CopyFrom(net)
    job.updater.type, job.updater.momentum = job_pb2.kSGD, MOMENTUM
    job.updater.learning_rate.type = job_pb2.kFixed
    job.updater.learning_rate.base_lr = LR
    job.train_steps = 10 ** 6
    job.test_steps = job.validate_steps = job.disp_freq = job.checkpoint_freq = 0
    job.cluster.workspace = workspace
    for sub in ("checkpoint", "visualization"):     # what the driver makes before setup
        os.makedirs(os.path.join(workspace, sub), exist_ok=True)
    if gpu:
        job.gpu.append(0)
    return job


class Ours:
    """Our runtime of zoo net `name` at `batch`, its params bench_zoo's values and its input
    the batch `x` with `labels`."""

    def __init__(self, name, batch, gpu, workspace, x, labels):
        self.rt = rt = Runtime(zoo_job(name, workspace, batch, gpu))
        w = rt.worker
        w.device.use()
        self.net = net = w.train_net
        seed(net, bench_zoo.NETS[name])
        for p in w.owned:       # the servers' copies: these values, whether they alias or not
            w.params.put(p)
        for p in w.owned:
            w.collect(p)
        dummies = [l for l in net.layers if l.conf.type == job_pb2.kDummy]
        inp = next(l for l in dummies if l.name.partition("#")[2] != LABELS)
        label = next(l for l in dummies if l.name.partition("#")[2] == LABELS)
        inp.feed(x)
        label.feed(np.zeros((batch, 1), np.float32), labels)
        if gpu:     # on the device once, as an input layer's mirror: no copy a step
            label.aux_mirror = w.device.put(label.aux_data)
        self.loss = next(l for l in net.layers if l.conf.type == job_pb2.kSoftmaxLoss)
        learned = [l for l in net.layers
                   if l.conf.type in (job_pb2.kConvolution, job_pb2.kInnerProduct)]
        #: the first convolution and the classifier (the last learned layer), by Caffe's names
        self.checked = [l.name.partition("#")[2] for l in (learned[0], learned[-1])]
        self.dropouts = [l for l in net.layers if l.conf.type == job_pb2.kDropout]

    def params(self):
        """{Caffe layer name: its params}."""
        return {l.name.partition("#")[2]: l.params for l in self.net.layers if l.params}

    def forward_backward(self):
        """(the loss, [the weight gradient of each `checked` layer]) of a forward and
        backward pass of the batch, nothing updated."""
        self.loss.metrics(job_pb2.kTrain)
        compute_only(self.rt)()
        grads = [host_copy(self.net.by_name["0#" + n].params[0].grad) for n in self.checked]
        return self.loss.metrics(job_pb2.kTrain)["Loss"], grads

    def dropout(self, on):
        for layer in self.dropouts:
            layer.keep = np.float32(1 - layer.conf.dropout_conf.dropout_ratio if on else 1)


def seed(net, prototxt):
    """bench_zoo's values (`seed_params`, drawn on the host) into the params of `net`."""
    shadow = types.SimpleNamespace(layers=[
        types.SimpleNamespace(params=[types.SimpleNamespace(
            name=p.name, data=np.zeros(p.data.shape, np.float32)) for p in layer.params])
        for layer in net.layers])
    bench_zoo.seed_params(shadow, prototxt)
    for layer, copy in zip(net.layers, shadow.layers):
        for p, q in zip(layer.params, copy.params):
            assign(p.data, q.data)


class Torch:
    """Zoo net `name` as torch modules on `device`, our params' values copied in, and SGD with
    our lr per param (`ours`: {layer name: our params})."""

    def __init__(self, name, ours, x, labels, device, folder):
        import torch
        self.torch, self.device = torch, device
        prototxt = scores_prototxt(bench_zoo.NETS[name], folder)
        layers = [l for l in netdef.read_net(prototxt).layer if l.type != "Input"]
        values = {n: [host_copy(p.data) for p in ps] for n, ps in ours.items()}
        model = zoo_reference.torch_net(prototxt, values)
        self.top = layers[-1].top[0]
        groups = collections.defaultdict(list)
        for i, (layer, module) in enumerate(zip(layers, model.mods)):
            if layer.type == "Dropout":
                model.mods[i] = torch.nn.Dropout(layer.dropout_param.dropout_ratio)
            # zip: a Convolution without bias_term has one torch param, ours a zero bias too
            for t, p in zip(module.parameters(), ours.get(layer.name, ())):
                if t.numel() != p.data.size:
                    raise Mismatch(f"layer '{layer.name}': torch's param of {t.numel()} "
                                   f"values against ours' {p.name} of {p.data.size}")
                t.requires_grad_(True)      # zoo_reference's Scale is not learned
                groups[p.lr_scale].append(t)
        self.model = model.to(device)
        self.dropouts = [m for m in model.mods if isinstance(m, torch.nn.Dropout)]
        self.opt = torch.optim.SGD([{"params": ps, "lr": LR * s} for s, ps in groups.items()],
                                   lr=LR, momentum=MOMENTUM)
        self.modules = {layer.name: m for layer, m in zip(layers, model.mods)}
        self.x = torch.from_numpy(x).to(device)
        self.labels = torch.from_numpy(labels.astype(np.int64)).to(device)

    def weight_grad(self, name):
        """The gradient of the weights of Caffe's layer `name`, in host memory."""
        return next(self.modules[name].parameters()).grad.detach().cpu().numpy()

    def forward_backward(self):
        """The loss of a forward and backward pass (the gradients left in the params)."""
        self.opt.zero_grad(set_to_none=True)
        scores = self.model(self.x)[self.top]
        loss = self.torch.nn.functional.cross_entropy(scores.flatten(1), self.labels)
        loss.backward()
        return loss

    def step_fn(self, tf32=False):
        """A training step: float32 throughout, or with TF32 products (`tf32`)."""
        backends = self.torch.backends

        def step():
            backends.cudnn.allow_tf32 = backends.cuda.matmul.allow_tf32 = tf32
            self.forward_backward()
            self.opt.step()
            if self.device == "cuda":
                self.torch.cuda.synchronize()
        return step

    def dropout(self, on):
        for m in self.dropouts:
            m.train(on)


def scores_prototxt(prototxt, folder):
    """A copy of `prototxt` in `folder` without its last layer (the Softmax): torch's net
    ends at the scores, which its cross-entropy takes."""
    net = netdef.read_net(prototxt)
    del net.layer[-1]
    path = os.path.join(folder, "scores.prototxt")
    with open(path, "w") as f:
        f.write(text_format.MessageToString(net))
    return path


def check(name, batch, ours, theirs):
    """Ours against torch in float32 without Dropout, one line (else Mismatch): the loss at
    step 0 and the classifier's weight gradient within TOLERANCE, the first convolution's
    weight gradient and the loss's change by one update within POOLED_TOLERANCE."""
    torch = theirs.torch
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    ours.dropout(False)
    theirs.dropout(False)
    loss0, (first, last) = ours.forward_backward()
    ref0 = theirs.forward_backward().item()
    ref_first, ref_last = (theirs.weight_grad(n) for n in ours.checked)
    theirs.opt.step()
    ours.rt.train_step()
    loss1, _ = ours.forward_backward()
    with torch.no_grad():
        ref1 = torch.nn.functional.cross_entropy(
            theirs.model(theirs.x)[theirs.top].flatten(1), theirs.labels).item()
    ours.dropout(True)
    theirs.dropout(True)
    conv, classifier = ours.checked
    diffs = {"loss": (relative(loss0, ref0), TOLERANCE),
             f"{classifier}'s weight gradient": (relative(last, ref_last), TOLERANCE),
             f"{conv}'s weight gradient": (relative(first, ref_first), POOLED_TOLERANCE),
             "loss's change by an update": (relative(loss1 - loss0, ref1 - ref0),
                                            POOLED_TOLERANCE)}
    print(f"{name} at {batch}: loss ours/torch {loss0:.6g}/{ref0:.6g}, after an update "
          f"{loss1:.6g}/{ref1:.6g}; |ours − torch| / |torch| (bound): "
          + ", ".join(f"{k} {d:.2g} ({t:g})" for k, (d, t) in diffs.items()), flush=True)
    for what, (d, bound) in diffs.items():
        if not d <= bound:
            raise Mismatch(f"ours and torch differ by more than {bound} in the {what} "
                           f"({d:.3g})")


def relative(ours, ref):
    """max |ours − ref| / max |ref| (of numbers or arrays of ref's shape)."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(ours.reshape(ref.shape) - ref).max() / np.abs(ref).max())


class Mismatch(Exception):
    """Ours and torch's nets differ (a param's size, a loss, a gradient): that net is not
    timed."""


class PoolPeak:
    """Within the block (or until `close`), the high-water mark `peak` of the bytes in use in
    CuPy's default pool, from `start`: its every malloc, in any thread without an allocator
    of its own (cupy.cuda.using_allocator), goes through `malloc`."""

    def __init__(self):
        import cupy
        self.cuda, self.pool = cupy.cuda, cupy.get_default_memory_pool()
        self.previous = None

    def __enter__(self):
        self.start = self.peak = self.pool.used_bytes()
        self.previous = self.cuda.get_allocator()
        self.cuda.set_allocator(self.malloc)
        return self

    def malloc(self, size):
        mem = self.pool.malloc(size)
        self.peak = max(self.peak, self.pool.used_bytes())
        return mem

    def close(self):
        if self.previous is not None:
            self.cuda.set_allocator(self.previous)
            self.previous = None

    def __exit__(self, *exc):
        self.close()


def bench(name, batch, args):
    """{side: median seconds per step}, {memory figure: bytes} ({} on the CPU) of `name` at
    `batch`."""
    import torch
    gpu = args.device == "gpu"
    rng = np.random.default_rng(1)
    x = rng.random((batch, 3, 224, 224), dtype=np.float32)
    labels = rng.integers(0, 1000, batch).astype(np.int32)
    folder = tempfile.mkdtemp(prefix=f"singa-bench-gpu-zoo-{name}-")
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        peak = stack.enter_context(PoolPeak()) if gpu else None
        ours = Ours(name, batch, gpu, folder, x, labels)
        stack.callback(ours.rt.close)
        if gpu:
            torch.cuda.reset_peak_memory_stats()
            start = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        theirs = Torch(name, ours.params(), x, labels, "cuda" if gpu else "cpu", folder)
        check(name, batch, ours, theirs)
        step = synced(ours.rt.train_step) if gpu else ours.rt.train_step
        memory = {}
        if gpu:
            for _ in range(MEMORY_STEPS):
                step()
                theirs.step_fn()()
            peak.close()
            pool = ours.rt.worker.graphs.pool
            memory = {"ours": peak.peak - peak.start + (pool.total_bytes() if pool else 0),
                      "torch": torch.cuda.max_memory_allocated() - start[0],
                      "torch reserved": torch.cuda.max_memory_reserved() - start[1]}
        sides = {"ours": step, "torch": theirs.step_fn()}
        if gpu:
            sides["torch TF32"] = theirs.step_fn(tf32=True)
        return interleaved(sides, args.rounds, args.steps, warmup=args.warmup), memory


def free_device():
    """What the last net left in CuPy's and torch's caches, back to the device."""
    import cupy
    import torch
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="resnet50,googlenet,vgg16,mobilenet",
                    help="comma-separated: " + ", ".join(bench_zoo.NETS))
    ap.add_argument("--batches", help="comma-separated, run in this order (default 128,32; "
                    "on the CPU 2)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 3; on the CPU 1)")
    ap.add_argument("--steps", type=int, help="steps per side per round (default 3; CPU 1)")
    ap.add_argument("--warmup", type=int, help="steps per side before timing (default 2; CPU 0)")
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--cpu-threads", type=int, default=2, help="ours' and torch's, on the CPU")
    args = ap.parse_args(argv)
    gpu = args.device == "gpu"
    defaults = ("128,32", 3, 3, 2) if gpu else ("2", 1, 1, 0)
    for key, value in zip(("batches", "rounds", "steps", "warmup"), defaults):
        if getattr(args, key) is None:
            setattr(args, key, value)
    names = args.nets.split(",")
    unknown = [n for n in names if n not in bench_zoo.NETS]
    if unknown:
        ap.error(f"--nets: unknown net {unknown[0]!r} (known: {', '.join(bench_zoo.NETS)})")
    batches = [int(b) for b in args.batches.split(",")]
    try:
        import torch
        if gpu:
            import cupy
    except ImportError as e:
        raise SystemExit(f"bench_gpu_zoo: no {e.name} here: it needs torch"
                         + (" with CUDA and CuPy (or --device cpu)" if gpu else "")) from None
    if gpu:
        props = cupy.cuda.runtime.getDeviceProperties(0)
        print(f"GPU 0: {props['name'].decode()}, CuPy {cupy.__version__}, torch "
              f"{torch.__version__} (CUDA {torch.version.cuda}), numpy {np.__version__}, "
              f"{os.cpu_count()} cpus")
        print_gpu_engine()
    else:
        torch.set_num_threads(args.cpu_threads)
        print(f"on the CPU: ours at {args.cpu_threads} compute threads, torch "
              f"{torch.__version__} at {torch.get_num_threads()} threads")
    print(f"{args.rounds} rounds x {args.steps} steps per side after {args.warmup}, median "
          f"ms/step; goals (issue 47): ours/torch float32 <= {GOAL_TIME} at batch "
          f"{GOAL_BATCH}, ours' device memory <= {GOAL_MEMORY}x torch's", flush=True)
    rows, failed = [], []
    with contextlib.nullcontext() if gpu else threads.limit(args.cpu_threads):
        for batch in batches:      # --batches' order: a device call may end before the last
            for name in names:
                t0 = time.perf_counter()
                try:
                    med, mem = bench(name, batch, args)
                except Exception as e:     # the other nets still run: a device call is scarce
                    if not isinstance(e, Mismatch):
                        traceback.print_exc()
                    print(f"bench_gpu_zoo: {name} at batch {batch}: {e}", flush=True)
                    failed.append(f"{name} at {batch}")
                    med = mem = None
                if gpu:
                    free_device()
                if med is None:
                    continue
                rows.append(row(name, batch, med, mem))
                print(f"{name} at {batch}: done in {time.perf_counter() - t0:.0f} s")
                print_table(rows[-1:], HEADER)
    print(f"\nsummary, {args.rounds} rounds x {args.steps} steps per side, median ms/step, "
          f"device memory in MB:")
    if rows:
        print_table(rows, HEADER)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


def row(name, batch, med, mem):
    ours, theirs, tf32 = med["ours"], med["torch"], med.get("torch TF32")
    ratio = ours / theirs
    out = [name, batch, f"{ours * 1e3:.1f}", f"{theirs * 1e3:.1f}", f"{ratio:.2f}",
           f"<= {GOAL_TIME}: {'yes' if ratio <= GOAL_TIME else 'NO'}" if batch == GOAL_BATCH
           else "-",
           "-" if tf32 is None else f"{tf32 * 1e3:.1f}",
           "-" if tf32 is None else f"{ours / tf32:.2f}"]
    if not mem:
        return out + ["-"] * 5
    m = mem["ours"] / mem["torch"]
    return out + [f"{mem['ours'] / MB:.0f}", f"{mem['torch'] / MB:.0f}", f"{m:.2f}",
                  f"<= {GOAL_MEMORY}: {'yes' if m <= GOAL_MEMORY else 'NO'}",
                  f"{mem['torch reserved'] / MB:.0f}"]


HEADER = ["net", "batch", "ours", "torch", "ours/torch", "goal", "torch TF32", "ours/TF32",
          "ours MB", "torch MB", "ours/torch MB", "goal", "torch reserved MB"]

if __name__ == "__main__":
    sys.exit(main())
