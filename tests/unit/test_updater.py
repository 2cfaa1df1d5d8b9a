"""Updaters and learning-rate generators against float64 references of SINGA's formulas (src/utils/updater.cc)."""
import tracemalloc

import numpy as np
import pytest
from google.protobuf import text_format

import cuda_shim
from singa.errors import CheckpointError, ConfigError, NonFiniteError
from singa.proto import job_pb2
from singa.train import updater, updater_cuda
from singa.train.updater import create_lr_generator, create_updater

F = lambda x: float(np.float32(x))  # a float conf field as SINGA reads it


def updater_proto(text):
    return text_format.Parse(text, job_pb2.UpdaterProto())


def lr_proto(text):
    return text_format.Parse(text, job_pb2.LRGenProto())


# ---------------------------------------------------------------- float64 references

def prelude(w, g, lr, wd, s, clip):
    if clip:
        g = np.clip(g, *clip)
    g = g * s
    if wd > 0:
        g = g + wd * w
    return g


def ref_sgd(w, g, st, lr, m, **_):
    if m > 0:
        st["h"] = m * st["h"] - lr * g
        return w + st["h"]
    return w - lr * g


def ref_nesterov(w, g, st, lr, m, **_):
    h_old = st["h"]
    st["h"] = m * h_old + lr * g
    return w - ((1 + m) * st["h"] - m * h_old)


def ref_adagrad(w, g, st, lr, **_):
    st["h"] = st["h"] + g * g
    return w - lr * g / np.sqrt(st["h"] + F(1e-8))


def ref_rmsprop(w, g, st, lr, rho, delta, **_):
    st["h"] = rho * st["h"] + (1 - rho) * g * g
    return w - lr * g / np.sqrt(st["h"] + delta)


def ref_adadelta(w, g, st, lr, rho, delta, **_):
    st["h"] = rho * st["h"] + (1 - rho) * g * g
    t = g * np.sqrt(st["u"] + delta) / np.sqrt(st["h"] + delta)
    st["u"] = rho * st["u"] + (1 - rho) * t * t
    return w - lr * t


def ref_adam(w, g, st, lr, b1, b2, delta, **_):
    st["h"] = b1 * st["h"] + (1 - b1) * g
    st["u"] = b2 * st["u"] + (1 - b2) * g * g
    return w - lr * st["h"] / np.sqrt(st["u"] + delta)


def ref_adammax(w, g, st, lr, b1, b2, delta, **_):
    st["h"] = b1 * st["h"] + (1 - b1) * g
    st["u"] = np.maximum(b2 * st["u"], np.abs(g)) + delta
    return w - lr * st["h"] / st["u"]


LR = 'learning_rate { type: kFixed base_lr: 0.05 }'
STEP_LR = "learning_rate { type: kStep base_lr: 0.5 step_conf { gamma: 0.7 change_freq: 2 } }"
CASES = {  # name: (conf, reference, hyper-parameters, clips, number of state buffers)
    "sgd": (f"type: kSGD {LR}", ref_sgd, dict(m=0.0), True, 0),
    "momentum": (f"type: kSGD momentum: 0.9 {LR}", ref_sgd, dict(m=F(0.9)), True, 1),
    "nesterov": (f"type: kNesterov momentum: 0.8 {LR}", ref_nesterov, dict(m=F(0.8)), True, 1),
    "adagrad": (f"type: kAdaGrad delta: 0.1 {LR}", ref_adagrad, {}, True, 1),
    "rmsprop": (f"type: kRMSProp delta: 1e-6 rmsprop_conf {{ rho: 0.95 }} {LR}", ref_rmsprop,
                dict(rho=F(0.95), delta=F(1e-6)), True, 1),
    "adadelta": (f"type: kAdaDelta delta: 1e-6 adadelta_conf {{ rho: 0.9 }} {LR}",
                 ref_adadelta, dict(rho=F(0.9), delta=F(1e-6)), False, 2),
    "adam": (f"type: kAdam delta: 1e-6 {LR}", ref_adam,
             dict(b1=F(0.9), b2=F(0.999), delta=F(1e-6)), False, 2),
    "adammax": (f"type: kAdamMax delta: 1e-6 adammax_conf {{ beta1: 0.8 beta2: 0.99 }} {LR}",
                ref_adammax, dict(b1=F(0.8), b2=F(0.99), delta=F(1e-6)), False, 2),
}


def run_both(name, extra="", steps=5, lr_scale=1.0, wd_scale=1.0, grad_scale=1.0, seed=0):
    """Run `steps` updates with ours and the float64 reference; return both final params."""
    conf, ref, hp, clips, _ = CASES[name]
    proto = updater_proto(conf + " " + extra)
    up = create_updater(proto)
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 1, (7, 13)).astype(np.float32)
    state = up.new_state(w.shape)
    w64 = w.astype(np.float64)
    st = {"h": np.zeros(w.shape), "u": np.zeros(w.shape)}
    lr = F(proto.learning_rate.base_lr) * lr_scale
    wd = F(proto.weight_decay) * wd_scale
    clip = (proto.clip_low, proto.clip_high) if clips and proto.clip_high > proto.clip_low else None
    for step in range(steps):
        g = rng.normal(0, 0.3, w.shape).astype(np.float32)
        g64 = prelude(w64, g.astype(np.float64), lr, wd, grad_scale, clip)
        w64 = ref(w64, g64, st, lr, **hp)
        up.update(step, w, g, state, lr_scale=lr_scale, wd_scale=wd_scale, grad_scale=grad_scale)
    return w, w64


@pytest.mark.parametrize("name", CASES)
def test_rule_matches_formula_over_steps(name):
    w, w64 = run_both(name)
    np.testing.assert_allclose(w, w64, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", CASES)
def test_rule_with_decay_and_scales_matches_formula(name):
    w, w64 = run_both(name, "weight_decay: 0.01", lr_scale=2.0, wd_scale=3.0, grad_scale=0.25)
    np.testing.assert_allclose(w, w64, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", CASES)
def test_clipping_applies_only_where_singa_clips(name):
    # the reference clips exactly for SGD/Nesterov/AdaGrad/RMSProp; a wrong choice shows
    w, w64 = run_both(name, "clip_low: -0.1 clip_high: 0.1", grad_scale=0.5)
    np.testing.assert_allclose(w, w64, rtol=2e-5, atol=2e-6)
    unclipped, _ = run_both(name, grad_scale=0.5)
    assert np.array_equal(w, unclipped) != CASES[name][3]


def kernels_on_the_host(monkeypatch):
    """The updater takes host arrays for a GPU's: updater_cuda's kernels run them, built by
    g++ (tests/cuda_shim.py)."""
    monkeypatch.setattr(updater, "is_host", lambda a: False)
    monkeypatch.setattr(updater_cuda, "_kernel", lambda xp, name="update":
                        cuda_shim.RawKernel(cuda_shim.source(cuda_shim.UPDATER), name))


@pytest.mark.parametrize("extra, scales", [
    ("", (1.0, 1.0, 1.0)), ("", (2.0, 1.0, 0.25)),
    ("weight_decay: 0.01 clip_low: -0.1 clip_high: 0.1", (2.0, 3.0, 0.25)),
    ("weight_decay: 0.01 clip_low: 0 clip_high: 0.2", (1.0, 1.0, 1.0))])
@pytest.mark.parametrize("name", CASES)
def test_the_gpu_kernel_of_each_rule_gives_the_bits_of_the_numpy_path(name, extra, scales,
                                                                       monkeypatch):
    """updater_cuda's kernel (built by g++, tests/cuda_shim.py) against numpy's calls: the same
    bytes of the param and its buffers over steps, on gradients holding zeros of both signs,
    the clip bounds themselves, and tiny and huge values."""
    if cuda_shim.compiler() is None:
        pytest.skip("no C++ compiler (g++, c++ or $CXX) to build the CUDA source with")
    rng = np.random.default_rng(7)
    w0 = rng.normal(0, 1, 600).astype(np.float32)
    w0[:4] = [0.0, -0.0, 1e-30, 3e18]
    grads = rng.normal(0, 0.3, (4, 600)).astype(np.float32)
    grads[:, :8] = [0.0, -0.0, 0.1, -0.1, 0.2, 1e-30, -1e-38, 1e18]
    runs = []
    for fused in (False, True):
        if fused:
            kernels_on_the_host(monkeypatch)
        up = create_updater(updater_proto(CASES[name][0] + " " + extra))
        w, state = w0.copy(), up.new_state(w0.shape)
        for step, g in enumerate(grads):
            up.update(step, w, g.copy(), state, *scales)
        runs.append([a.tobytes() for a in (w, *state)])
    assert runs[1] == runs[0]


@pytest.mark.parametrize("extra", ["", "weight_decay: 0.01 clip_low: -0.1 clip_high: 0.1", "step"])
@pytest.mark.parametrize("name", CASES)
def test_one_launch_for_a_buckets_slices_gives_the_bits_of_each_slice_on_its_own(
        name, extra, monkeypatch):
    """updater_cuda's kernel of a bucket (built by g++) against numpy's calls slice by slice:
    slices of several sizes (one empty) with their own lr_scale, wd_scale and grad scale, over
    steps whose gradients move (their addresses go up again) and a learning rate that
    changes; a bucket of other buffers gets tables of its own."""
    if cuda_shim.compiler() is None:
        pytest.skip("no C++ compiler (g++, c++ or $CXX) to build the CUDA source with")
    rng = np.random.default_rng(3)
    sizes, scales = (600, 1, 0, 37), [(1.0, 1.0, 1.0), (2.0, 0.0, 0.5), (1.0, 1.0, 1.0),
                                      (0.5, 3.0, 0.25)]
    w0 = [rng.normal(0, 1, n).astype(np.float32) for n in sizes]
    grads = [[rng.normal(0, 0.3, n).astype(np.float32) for n in sizes] for _ in range(4)]
    runs = []
    for fused in (False, True):
        if fused:
            kernels_on_the_host(monkeypatch)
        conf = CASES[name][0].replace(LR, STEP_LR) if extra == "step" else \
            CASES[name][0] + " " + extra
        up = create_updater(updater_proto(conf))
        w = [a.copy() for a in w0]
        state = [up.new_state(a.shape) for a in w]
        for step, gs in enumerate(grads):
            if step == 2:                   # a re-Put: new buffers, a new bucket
                state = [[b.copy() for b in st] for st in state]
            up.update_many(step, [(a, g.copy(), st, *sc)
                                  for a, g, st, sc in zip(w, gs, state, scales)])
        runs.append([a.tobytes() for a in w + [b for st in state for b in st]])
        if fused:
            assert len(up._buckets) == (2 if up.nstate else 1)
    assert runs[1] == runs[0]


def test_clipping_is_off_unless_high_above_low():
    w, _ = run_both("sgd", "clip_low: 0.1 clip_high: 0.1")
    plain, _ = run_both("sgd")
    assert np.array_equal(w, plain)


def test_nonpositive_weight_decay_is_ignored():
    w, _ = run_both("momentum", "weight_decay: -0.5")
    plain, _ = run_both("momentum")
    assert np.array_equal(w, plain)


def test_adagrad_ignores_configured_delta():
    # SINGA's bug: delta is always 1e-8; with a tiny history a delta of 0.1 would dominate
    up = create_updater(updater_proto(f"type: kAdaGrad delta: 0.1 {LR}"))
    w = np.zeros(3, np.float32)
    g = np.full(3, 1e-3, np.float32)
    up.update(0, w, g, up.new_state(3))
    np.testing.assert_allclose(w, -F(0.05) * 1e-3 / np.sqrt(1e-6 + 1e-8), rtol=1e-5)


@pytest.mark.parametrize("name", CASES)
def test_new_state_holds_zeroed_buffers_the_rule_needs(name):
    up = create_updater(updater_proto(CASES[name][0]))
    state = up.new_state((4, 5))
    assert len(state) == CASES[name][4]
    assert all(s.shape == (4, 5) and s.dtype == np.float32 and not s.any() for s in state)


@pytest.mark.parametrize("name", CASES)
def test_same_inputs_give_same_bytes(name):
    a, _ = run_both(name, "weight_decay: 0.01", grad_scale=0.5, seed=3)
    b, _ = run_both(name, "weight_decay: 0.01", grad_scale=0.5, seed=3)
    assert a.tobytes() == b.tobytes()


def test_state_resumes_bit_exactly():
    # 6 steps straight equal 3 steps, then a fresh updater given the saved buffers, 3 more
    conf = updater_proto(f"type: kAdam {LR}")
    rng = np.random.default_rng(1)
    w0 = rng.normal(0, 1, 50).astype(np.float32)
    grads = rng.normal(0, 1, (6, 50)).astype(np.float32)
    up = create_updater(conf)
    w, state = w0.copy(), up.new_state(50)
    for step in range(6):
        up.update(step, w, grads[step].copy(), state)
    w2, state2 = w0.copy(), up.new_state(50)
    for step in range(3):
        up.update(step, w2, grads[step].copy(), state2)
    saved = [s.copy() for s in state2]
    up2 = create_updater(conf)
    for step in range(3, 6):
        up2.update(step, w2, grads[step].copy(), saved)
    assert w.tobytes() == w2.tobytes()


def peak_alloc(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("conf", [f"type: kSGD {LR}", f"type: kSGD momentum: 0.9 {LR}"])
def test_sgd_allocates_no_param_sized_temporary(conf):
    up = create_updater(updater_proto(conf))
    n = 1 << 20
    w, g = np.ones(n, np.float32), np.ones(n, np.float32)
    state = up.new_state(n)
    assert peak_alloc(lambda: up.update(5, w, g, state, grad_scale=0.5)) < n
    np.testing.assert_allclose(w[:3], 1 - F(0.05) * 0.5, rtol=1e-6)


@pytest.mark.parametrize("name", ["momentum", "nesterov", "adagrad", "rmsprop", "adadelta",
                                  "adam", "adammax"])
def test_scratch_buffer_is_reused_across_updates(name):
    up = create_updater(updater_proto(CASES[name][0] + " weight_decay: 0.01"))
    n = 1 << 18
    w, state = np.ones(n, np.float32), up.new_state(n)
    up.update(0, w, np.ones(n, np.float32), state)
    g = np.ones(n, np.float32)
    assert peak_alloc(lambda: up.update(1, w, g, state)) < n


def test_user_updater_and_user_type_are_config_errors():
    with pytest.raises(ConfigError, match="kUserUpdater"):
        create_updater(updater_proto(LR))
    with pytest.raises(ConfigError, match="'mine'"):
        create_updater(updater_proto(f'type: kSGD user_type: "mine" {LR}'))


def test_rmsprop_without_rho_is_a_config_error():
    with pytest.raises(ConfigError, match="rmsprop_conf"):
        create_updater(updater_proto(f"type: kRMSProp {LR}"))


# ---------------------------------------------------------------- learning-rate generators

def test_fixed():
    gen = create_lr_generator(lr_proto("type: kFixed base_lr: 0.1"))
    assert gen(0) == gen(12345) == F(0.1)


def test_step_uses_integer_division():
    gen = create_lr_generator(lr_proto(
        "type: kStep base_lr: 0.001 step_conf { change_freq: 60 gamma: 0.997 }"))
    for step in (0, 1, 59, 60, 119, 120, 999, 6000):
        assert gen(step) == pytest.approx(F(0.001) * F(0.997) ** (step // 60), rel=1e-7)
    assert gen(59) == gen(0) != gen(60)


def test_linear_is_not_clamped():
    gen = create_lr_generator(lr_proto(
        "type: kLinear base_lr: 0.1 linear_conf { change_freq: 100 final_lr: 0.01 }"))
    for step in (0, 30, 100, 200):
        r = step / 100
        assert gen(step) == pytest.approx((1 - r) * F(0.1) + r * F(0.01), rel=1e-6)
    assert gen(200) < F(0.01)


def test_exponential_halves_every_change_freq():
    gen = create_lr_generator(lr_proto(
        "type: kExponential base_lr: 0.2 exponential_conf { change_freq: 10 }"))
    for step in (0, 5, 10, 35):
        assert gen(step) == pytest.approx(F(0.2) / 2 ** (step / 10), rel=1e-7)


def test_inverse():
    gen = create_lr_generator(lr_proto(
        "type: kInverse base_lr: 0.01 inverse_conf { gamma: 0.0001 pow: 0.75 }"))
    for step in (0, 10, 1000, 50000):
        expected = F(0.01) * (1 + F(0.0001) * step) ** -F(0.75)
        assert gen(step) == pytest.approx(expected, rel=1e-6)


def test_inverse_t():
    gen = create_lr_generator(lr_proto(
        "type: kInverseT base_lr: 0.02 inverset_conf { final_lr: 0.01 }"))
    for step in (0, 1, 7):
        assert gen(step) == pytest.approx(F(0.02) / (1 + step / F(0.01)), rel=1e-6)


def test_schedules_beyond_a_doubles_range_give_their_limit_not_an_exception():
    """2^(step/change_freq) past 2^1024, γ^k past the largest double: Python's float raises
    OverflowError; the rate is 0 (kExponential) or inf (then a NonFiniteError naming the step,
    before an update uses it)."""
    gen = create_lr_generator(lr_proto(
        "type: kExponential base_lr: 0.2 exponential_conf { change_freq: 1 }"))
    assert gen(100) > 0 and gen(2000) == 0.0 and gen(2**31 - 1) == 0.0
    step = create_lr_generator(lr_proto("type: kStep base_lr: 0.1 step_conf { gamma: 2 "
                                        "change_freq: 1 }"))
    assert step(10) == F(0.1) * 1024 and step(2000) == float("inf")
    up = create_updater(updater_proto("type: kSGD learning_rate { type: kStep base_lr: 0.1 "
                                      "step_conf { gamma: 2 change_freq: 1 } }"))
    w, g = np.ones(3, np.float32), np.ones(3, np.float32)
    up.update(10, w, g, up.new_state(w.shape))
    with pytest.raises(NonFiniteError, match=r"^step 200: the learning rate is inf "
                                             r"\(updater.learning_rate kStep"):
        up.update(200, w, g, up.new_state(w.shape))


@pytest.mark.parametrize("conf, message", [
    ("type: kInverse base_lr: 0.1 inverse_conf { gamma: -1 pow: 0.5 }",
     r"inverse_conf.gamma must be >= 0 \(got -1\)"),
    ("type: kInverseT base_lr: 0.1 inverset_conf { final_lr: -1 }",
     r"inverset_conf.final_lr must be > 0 \(got -1")])
def test_schedules_that_would_divide_by_zero_or_leave_the_reals_are_refused(conf, message):
    with pytest.raises(ConfigError, match=message):
        create_lr_generator(lr_proto(conf))


FIXEDSTEP = ("type: kFixedStep base_lr: 7 fixedstep_conf { step: 0 step: 100 step: 200 "
             "step: 300 step_lr: 0.1 step_lr: 0.01 step_lr: 0.001 step_lr: 0.0001 }")


def test_fixed_step_follows_steps_when_called_every_step():
    gen = create_lr_generator(lr_proto(FIXEDSTEP))
    lrs = [gen(step) for step in range(400)]
    assert lrs[0] == lrs[99] == F(0.1) and lrs[100] == lrs[199] == F(0.01)
    assert lrs[200] == F(0.001) and lrs[300] == lrs[399] == F(0.0001)
    assert gen.get_index() == 3


def test_fixed_step_fresh_generator_lags_one_index_per_call():
    gen = create_lr_generator(lr_proto(FIXEDSTEP))
    assert [gen(350) for _ in range(4)] == [F(0.01), F(0.001), F(0.0001), F(0.0001)]


def test_fixed_step_set_index_resumes_exactly():
    straight = create_lr_generator(lr_proto(FIXEDSTEP))
    expected = [straight(step) for step in range(400)]
    first = create_lr_generator(lr_proto(FIXEDSTEP))
    got = [first(step) for step in range(250)]
    resumed = create_lr_generator(lr_proto(FIXEDSTEP))
    resumed.set_index(first.get_index())
    got += [resumed(step) for step in range(250, 400)]
    assert got == expected


def test_fixed_step_bad_state_is_a_checkpoint_error():
    with pytest.raises(CheckpointError, match="index 4"):
        create_lr_generator(lr_proto(FIXEDSTEP)).set_index(4)


def test_updater_uses_the_schedule_times_lr_scale():
    up = create_updater(updater_proto(
        "type: kSGD learning_rate { type: kStep base_lr: 0.5 step_conf { change_freq: 2 gamma: 0.5 } }"))
    assert up.lr_gen(3) == 0.25
    w = np.zeros(2, np.float32)
    up.update(3, w, np.ones(2, np.float32), [], lr_scale=2.0)
    assert np.array_equal(w, [-0.5, -0.5])


def test_a_fixed_step_schedule_is_asked_every_update_others_once_a_step(monkeypatch):
    """The updates of one step share a schedule of the step alone; kFixedStep's advances a
    call at a time, so each update of a step still asks it (a fresh one lags per update)."""
    up = create_updater(updater_proto(f"type: kSGD learning_rate {{ {FIXEDSTEP} }}"))
    moves = []
    for _ in range(4):
        w = np.zeros(1, np.float32)
        up.update(350, w, np.ones(1, np.float32), [])
        moves.append(-w[0])
    assert moves == [F(0.01), F(0.001), F(0.0001), F(0.0001)]
    up = create_updater(updater_proto(
        "type: kSGD learning_rate { type: kStep base_lr: 0.5 step_conf { change_freq: 2 gamma: 0.5 } }"))
    asked = []
    rate = updater.StepLRGen.__call__
    monkeypatch.setattr(updater.StepLRGen, "__call__",
                        lambda gen, step: asked.append(step) or rate(gen, step))
    for step in (3, 3, 3, 4, 4):
        up.update(step, np.zeros(1, np.float32), np.ones(1, np.float32), [])
    assert asked == [3, 4]


@pytest.mark.parametrize("text, match", [
    ("base_lr: 0.1", "kUserChange"),
    ('type: kFixed user_type: "cosine"', "'cosine'"),
    ("type: kStep step_conf { gamma: 0.5 }", "change_freq"),
    ("type: kLinear linear_conf { final_lr: 0.1 change_freq: 0 }", "change_freq"),
    ("type: kExponential", "change_freq"),
    ("type: kInverseT", "final_lr"),
    ("type: kFixedStep fixedstep_conf { step: 0 step: 5 step_lr: 0.1 }", "fixedstep_conf"),
    ("type: kFixedStep", "fixedstep_conf"),
])
def test_unusable_schedules_are_config_errors(text, match):
    with pytest.raises(ConfigError, match=match):
        create_lr_generator(lr_proto(text))
