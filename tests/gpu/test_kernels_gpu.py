"""Our CUDA kernels on GPU 0 against the CPU: each of singa/layers/kernels/cuda.py's against numba's
loops on the same inputs, a net of pooling layers against numpy's pooling, and each update
rule of singa/train/updater_cuda.py against numpy's calls: the same float32 bytes (the kernels add
in the CPU's order, NVRTC with --fmad=false: no fused multiply-adds; no atomics)."""
import numpy as np
import pytest
from google.protobuf import text_format
from test_layers_gpu import blobs, run

from singa import device
from singa.layers.kernels import cuda
from singa.proto import job_pb2
from singa.train.updater import create_updater

loops = pytest.importorskip("singa.layers.kernels.numba")

# (b, C, H, W, kh, kw, ph, pw, sh, sw): padding, strides above and below the kernel, odd sizes
CONV = [(8, 16, 15, 17, 3, 3, 1, 1, 1, 1), (4, 6, 16, 13, 3, 2, 0, 1, 2, 2),
        (3, 5, 19, 19, 5, 5, 2, 2, 3, 3), (2, 4, 9, 9, 4, 4, 3, 3, 1, 2)]
# (b, G, m, cg, H, W, kh, kw, ph, pw, sh, sw): depthwise, small groups
GROUPS = [(4, 32, 1, 1, 14, 14, 3, 3, 1, 1, 1, 1), (2, 4, 2, 2, 11, 9, 3, 3, 1, 0, 2, 2),
          (3, 8, 1, 1, 9, 8, 5, 5, 2, 2, 3, 3)]


def on_gpu(*arrays):
    return [device.Device(0).put(a) for a in arrays]


def same(gpu, cpu):
    assert device.host(gpu).tobytes() == cpu.tobytes(), np.abs(device.host(gpu) - cpu).max()
    return True


@pytest.mark.parametrize("case", CONV)
def test_im2col_and_col2im_give_numbas_bytes(case):
    b, c, h, w, kh, kw, ph, pw, sh, sw = case
    rng = np.random.default_rng(0)
    shape = (c, kh, kw, b, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1)
    for channels_first in (False, True):
        x = rng.standard_normal((c, b, h, w) if channels_first else (b, c, h, w), np.float32)
        want = loops.im2col(x, ph, pw, sh, sw, np.empty(shape, np.float32), channels_first)
        xg, col = on_gpu(x, np.zeros(shape, np.float32))
        assert same(cuda.im2col(xg, ph, pw, sh, sw, col, channels_first), want)
    col = rng.standard_normal(shape, np.float32)
    want = loops.col2im(col, ph, pw, sh, sw, np.empty((b, c, h, w), np.float32))
    colg, gx = on_gpu(col, np.zeros((b, c, h, w), np.float32))
    assert same(cuda.col2im(colg, ph, pw, sh, sw, gx), want)


@pytest.mark.parametrize("case", GROUPS)
def test_direct_group_convolution_gives_numbas_bytes(case):
    b, ng, m, cg, h, w, kh, kw, ph, pw, sh, sw = case
    rng = np.random.default_rng(1)
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    x = rng.standard_normal((b, ng * cg, h, w), np.float32)
    wt = rng.standard_normal((ng, m, cg, kh, kw), np.float32)
    bias = rng.standard_normal(ng * m, np.float32)
    gy = rng.standard_normal((b, ng * m, oh, ow), np.float32)
    xg, wg, bg, gyg = on_gpu(x, wt, bias, gy)
    y, acc, gx = on_gpu(np.zeros(gy.shape, np.float32),
                        np.zeros((ng * m, cg, kh, kw, oh, ow), np.float32),
                        np.zeros(x.shape, np.float32))
    assert same(cuda.group_conv(xg, wg, bg, ph, pw, sh, sw, y),
                loops.group_conv(x, wt, bias, ph, pw, sh, sw, np.empty(gy.shape, np.float32)))
    assert same(cuda.group_conv_wgrad(xg, gyg, ph, pw, sh, sw, acc),
                loops.group_conv_wgrad(x, gy, ph, pw, sh, sw, np.empty(acc.shape, np.float32)))
    assert same(cuda.group_conv_xgrad(gyg, wg, ph, pw, sh, sw, gx),
                loops.group_conv_xgrad(gy, wt, ph, pw, sh, sw, np.empty(x.shape, np.float32)))


POOLS = """
layer { name: "x" type: kDummy dummy_conf { input: true shape: 8 shape: 6 shape: 15 shape: 15 } }
layer { name: "t" type: kDummy dummy_conf { input: true shape: 8 shape: 6 shape: 4 shape: 4 } }
layer { name: "p1" type: kPooling srclayers: "x"
  pooling_conf { pool: MAX kernel: 3 stride: 2 pad: 1 ceil_mode: true } }
layer { name: "p2" type: kCudnnPool srclayers: "p1" pooling_conf { pool: AVG kernel: 2 stride: 1 pad: 1 } }
layer { name: "p3" type: kCPooling srclayers: "p2"
  pooling_conf { pool: AVG kernel: 3 stride: 2 pad: 1 ceil_mode: true } }
layer { name: "p4" type: kPooling srclayers: "p3" pooling_conf { pool: MAX kernel: 2 stride: 1 } }
layer { name: "loss" type: kEuclideanLoss srclayers: "p4" srclayers: "t" }
"""


def test_pooling_layers_give_the_cpus_bytes():
    """MAX (ceil mode, overlapping, padded, ties among small integers) and AVG (both
    divisors), forward and backward; the Euclidean loss's gradient is elementwise."""
    conf = text_format.Parse(POOLS, job_pb2.NetProto())
    x = np.random.default_rng(2).integers(-4, 5, (8, 6, 15, 15)).astype(np.float32)
    cpu = blobs(run(conf, device.CPU, x, None))
    gpu = blobs(run(conf, device.Device(0), x, None))
    assert gpu.keys() == cpu.keys() and len(cpu) == 12
    for key, ours in cpu.items():
        if "loss" not in key:
            assert gpu[key].tobytes() == ours.tobytes(), key


@pytest.mark.parametrize("conf", [
    "type: kSGD weight_decay: 0.01", "type: kSGD momentum: 0.9 clip_low: -0.1 clip_high: 0.1",
    "type: kNesterov momentum: 0.9 weight_decay: 0.01 clip_low: -0.1 clip_high: 0.1",
    "type: kAdaGrad", "type: kRMSProp delta: 1e-6 rmsprop_conf { rho: 0.95 }",
    "type: kAdaDelta delta: 1e-6 adadelta_conf { rho: 0.9 } weight_decay: 0.01",
    "type: kAdam delta: 1e-6", "type: kAdamMax delta: 1e-6 adammax_conf { beta1: 0.8 beta2: 0.99 }"])
def test_each_update_rule_as_one_kernel_gives_the_hosts_bytes(conf):
    """singa.train.updater_cuda on the GPU against numpy's calls on the host, over steps with grad
    and lr scales (NVRTC: IEEE division and square root, no fused multiply-adds)."""
    proto = text_format.Parse(f"{conf} learning_rate {{ type: kFixed base_lr: 0.1 }}",
                              job_pb2.UpdaterProto())
    rng = np.random.default_rng(5)
    w = rng.normal(0, 1, 100_003).astype(np.float32)
    grads = rng.normal(0, 0.3, (3, w.size)).astype(np.float32)
    runs = []
    for dev in (device.CPU, device.Device(0)):
        up = create_updater(proto)
        data, state = dev.put(w.copy()), up.new_state(w.shape, dev.xp)
        for step, g in enumerate(grads):
            up.update(step, data, dev.put(g.copy()), state, lr_scale=2.0, grad_scale=0.5)
        runs.append([device.host(a).tobytes() for a in (data, *state)])
    assert runs[1] == runs[0]


@pytest.mark.parametrize("conf", ["type: kSGD momentum: 0.9", "type: kAdam delta: 1e-6 "
                                  "weight_decay: 0.01 clip_low: -0.1 clip_high: 0.1"])
def test_the_slices_of_a_bucket_in_one_launch_give_the_hosts_bytes(conf):
    """Updater.update_many on the GPU (updater_cuda.Bucket: one launch over the slices'
    tables) against numpy's calls slice by slice on the host: slices of their own sizes (one
    empty) and scales, gradients that move between steps."""
    proto = text_format.Parse(f"{conf} learning_rate {{ type: kFixed base_lr: 0.1 }}",
                              job_pb2.UpdaterProto())
    rng = np.random.default_rng(6)
    sizes, scales = (100_003, 1, 0, 517), [(1.0, 1.0, 1.0), (2.0, 0.0, 0.5), (1.0, 1.0, 1.0),
                                            (0.5, 3.0, 0.25)]
    w0 = [rng.normal(0, 1, n).astype(np.float32) for n in sizes]
    grads = [[rng.normal(0, 0.3, n).astype(np.float32) for n in sizes] for _ in range(3)]
    runs = []
    for dev in (device.CPU, device.Device(0)):
        up = create_updater(proto)
        data = [dev.put(a.copy()) for a in w0]
        state = [up.new_state(a.shape, dev.xp) for a in w0]
        for step, gs in enumerate(grads):
            up.update_many(step, [(d, dev.put(g.copy()), st, *sc)
                                  for d, g, st, sc in zip(data, gs, state, scales)])
        runs.append([device.host(a).tobytes() for a in data + [b for st in state for b in st]])
    assert runs[1] == runs[0]
