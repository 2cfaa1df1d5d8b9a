"""Bench: the forward pass of Caffe zoo nets imported by ours against the same nets in PyTorch.

    python bench/bench_zoo.py [--nets resnet50,vgg16,googlenet,mobilenet] [--batch 8]
                              [--threads 2] [--rounds 5] [--steps 2] [--profile]

Each net's deploy prototxt (tests/fixtures/caffe/zoo/real, bench/zoo; README there) is
imported by `import_caffe` without weights and built as our kTest net at --batch (its input a
kDummy layer, as `deploy.deploy_net` makes it); every param gets seeded random values (weights
N(0, 2/fan_in), BatchNorm statistics of variance 0.5-1.5, Scale 0.3-0.6, so that the
activations stay finite through 50 layers). `zoo_reference.torch_net` builds the same
prototxt as torch modules with those values copied in. One input, both forwards: the
output and the scores before the softmax must agree within 1e-3 of their largest value (else
the bench stops with exit 1); then forwards in interleaved rounds (bench_mlp_step.interleaved:
ours, torch, ours, torch ..., 0.2 s apart), the median per side. Ours runs at --threads
compute threads (singa/device/threads.py, BLAS at one), torch at torch.set_num_threads(--threads),
under torch.inference_mode().

Memory, in a child process per net (no torch in it), from before our net is built to the end
of its first forward, against the bytes of its params' values: the growth of the resident set
to its high-water mark (VmHWM − VmRSS before, /proc/self/status: the pages the build and the
forward wrote, what the machine must have), and the peak of the bytes allocated
(tracemalloc, which numpy reports its arrays' data to: every buffer the net holds counts,
written or not, e.g. the gradient blobs of zero pages a forward never touches).
Target (issue 29): ours / torch <= 1.5 for each net. The bench measures; it exits 0 whatever
the ratio.
"""
import argparse
import cProfile
import io
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc

import singa  # first: it picks OpenBLAS's kernels before numpy loads it
import numpy as np

import zoo_reference
from bench_mlp_step import interleaved, print_blas, print_table, set_torch_threads
from singa.device import CPU
from singa.device import threads
from singa.interop import deploy
from singa.interop.caffe import netdef
from singa.interop.caffe.importer import import_caffe
from singa.job import config
from singa.layers import kernels
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(singa.HOME, "tests", "fixtures", "caffe", "zoo", "real")
NETS = {"resnet50": os.path.join(REAL, "ResNet-50-deploy.prototxt"),
        "vgg16": os.path.join(HERE, "zoo", "VGG_ILSVRC_16_layers_deploy.prototxt"),
        "googlenet": os.path.join(HERE, "zoo", "bvlc_googlenet_deploy.prototxt"),
        "mobilenet": os.path.join(REAL, "mobilenet_deploy.prototxt")}
TARGET = 1.5
TOLERANCE = 1e-3


def our_net(prototxt, batch, workspace):
    """Our kTest net of `prototxt` at `batch`, and its input layer."""
    conf = import_caffe(prototxt, workspace, print=lambda *a: None)
    job = config.load_job(conf, check_paths=False)
    net_conf = deploy.deploy_net(job.neuralnet, conf)
    for layer in net_conf.layer:
        if layer.type == job_pb2.kDummy and layer.dummy_conf.input:
            layer.dummy_conf.shape[0] = batch
    net = NeuralNet(net_conf, job_pb2.kTest, np.random.default_rng(0))
    inputs = [l for l in net.layers if l.conf.type == job_pb2.kDummy and l.conf.dummy_conf.input]
    return net, inputs[0]


def seed_params(net, prototxt, seed=0):
    """Every param's values, drawn by its role (the suffix of its name); see the docstring.
    The zero bias the importer gives a layer with bias_term false stays 0."""
    fixed = {"0#" + l.name + "_bias" for l in netdef.read_net(prototxt).layer
             if (l.type == "Convolution" and not l.convolution_param.bias_term)
             or (l.type == "InnerProduct" and not l.inner_product_param.bias_term)}
    rng = np.random.default_rng(seed)
    draw = {"weight": lambda s: rng.normal(0, np.sqrt(2 / s[1]), s),
            "bias": lambda s: rng.normal(0, 0.01, s), "mean": lambda s: rng.normal(0, 0.1, s),
            "variance": lambda s: rng.uniform(0.5, 1.5, s), "factor": lambda s: np.ones(s),
            "scale": lambda s: rng.uniform(0.3, 0.6, s)}
    for layer in net.layers:
        for p in layer.params:
            if p.name not in fixed:
                p.data[...] = draw[p.name.rpartition("_")[2]](p.data.shape)


def last_writers(prototxt):
    """Caffe's blob name -> the layer that writes it last (in-place layers share a blob)."""
    return {top: layer.name for layer in netdef.read_net(prototxt).layer for top in layer.top}


def compare(net, prototxt, model, x):
    """Max |ours − torch| / max |torch| of the last layer's top and of the last layer's
    bottom (the scores before the softmax): {blob: difference}."""
    import torch
    last = netdef.read_net(prototxt).layer[-1]
    writer = last_writers(prototxt)
    with torch.inference_mode():
        theirs = model(torch.from_numpy(x), keep=set(last.bottom))
    net.forward(job_pb2.kTest)
    out = {}
    for blob in list(last.bottom) + [last.top[0]]:
        ours = net.by_name["0#" + writer[blob]].data
        ref = theirs[blob].numpy()
        out[blob] = float(np.abs(ours.reshape(ref.shape) - ref).max() / np.abs(ref).max())
    return out


def _status_mb(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1e3 for line in f if line.startswith(key))


def memory(name, batch):
    """(weights MB, resident growth MB, allocated peak MB) of building our net and one
    forward, in this process (the child that `bench` starts)."""
    prototxt = NETS[name]
    kernels.choose(CPU)        # numba and the compiled loops loaded before
    with tempfile.TemporaryDirectory(prefix=f"singa-bench-zoo-{name}-") as workspace:
        rss = _status_mb("VmRSS")
        tracemalloc.start()
        net, inp = our_net(prototxt, batch, workspace)
        seed_params(net, prototxt)
        inp.feed(np.random.default_rng(1).random(inp.data.shape, dtype=np.float32))
        net.forward(job_pb2.kTest)
        allocated = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
    weights = sum(p.data.nbytes for layer in net.layers for p in layer.params) / 1e6
    return weights, _status_mb("VmHWM") - rss, allocated


def bench(name, args):
    prototxt = NETS[name]
    out = subprocess.run([sys.executable, __file__, "--memory-of", name, "--batch",
                          str(args.batch), "--threads", str(args.threads)],
                         capture_output=True, text=True, check=True).stdout
    weights, resident, allocated = map(float, out.split())
    workspace = tempfile.mkdtemp(prefix=f"singa-bench-zoo-{name}-")
    try:
        net, inp = our_net(prototxt, args.batch, workspace)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    seed_params(net, prototxt)
    x = np.random.default_rng(1).random(inp.data.shape, dtype=np.float32)
    inp.feed(x)
    sides = {"ours": lambda: net.forward(job_pb2.kTest)}
    params = {l.name.partition("#")[2]: [p.data for p in l.params] for l in net.layers}
    model = zoo_reference.torch_net(prototxt, params)
    ratio = None
    if model is not None:
        import torch
        diffs = compare(net, prototxt, model, x)
        print(f"{name}: max |ours − torch| / max |torch|: "
              + ", ".join(f"{b} {d:.2g}" for b, d in diffs.items()))
        if max(diffs.values()) > TOLERANCE:
            raise SystemExit(f"bench_zoo: {name}: ours and torch differ by more than "
                             f"{TOLERANCE} (max relative difference {max(diffs.values()):.3g})")
        xt = torch.from_numpy(x)
        # torch's channels-last layout: its fast CPU path for convolution (oneDNN's blocked
        # kernels without a reorder of every blob), several times faster than NCHW here
        last = zoo_reference.torch_net(prototxt, params).to(memory_format=torch.channels_last)
        xl = xt.contiguous(memory_format=torch.channels_last)
        sides["torch NCHW"] = lambda: torch_forward(model, xt)
        sides["torch NHWC"] = lambda: torch_forward(last, xl)
    med = interleaved(sides, args.rounds, args.steps)
    if len(med) > 1:
        best = min(med["torch NCHW"], med["torch NHWC"])
        ratio = med["ours"] / best
    if args.profile:
        profile(net, args.steps)
    return [name, f"{med['ours'] * 1e3:.0f}",
            f"{med['torch NCHW'] * 1e3:.0f}" if ratio else "-",
            f"{med['torch NHWC'] * 1e3:.0f}" if ratio else "-",
            f"{ratio:.2f}" if ratio else "-", str(TARGET),
            ("within" if ratio <= TARGET else "ABOVE") if ratio else "",
            f"{weights:.1f}", f"{resident:.0f} ({resident / weights:.1f}x)",
            f"{allocated:.0f} ({allocated / weights:.1f}x)"]


def torch_forward(model, x):
    import torch
    with torch.inference_mode():
        model(x)


def profile(net, steps):
    """Our layers' own time over `steps` forwards, the top 15 by cumulative time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        net.forward(job_pb2.kTest)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
    print(s.getvalue())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default=",".join(NETS), help="comma-separated: " + ", ".join(NETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2, help="compute threads of ours and torch's")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--steps", type=int, default=2, help="forwards per side per round")
    ap.add_argument("--profile", action="store_true", help="profile our forwards after timing")
    ap.add_argument("--memory-of", help=argparse.SUPPRESS)     # the child of `bench`
    args = ap.parse_args(argv)
    if args.memory_of:
        with threads.limit(args.threads):
            print(*memory(args.memory_of, args.batch))
        return 0
    names = args.nets.split(",")
    unknown = [n for n in names if n not in NETS]
    if unknown:
        ap.error(f"--nets: unknown net {unknown[0]!r} (known: {', '.join(NETS)})")
    print_blas()
    set_torch_threads(args.threads)
    print(f"compute threads {args.threads}, batch {args.batch}, {args.rounds} rounds x "
          f"{args.steps} forwards per side, median; load average {os.getloadavg()[0]:.1f}")
    rows = []
    with threads.limit(args.threads):
        for name in names:
            t0 = time.perf_counter()
            rows.append(bench(name, args))
            print(f"{name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    print_table(rows, ["net", "ours ms", "torch NCHW ms", "torch NHWC ms", "ours/torch", "target", "",
                       "weights MB", "ours: resident MB (/weights)",
                       "allocated MB (/weights)"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
