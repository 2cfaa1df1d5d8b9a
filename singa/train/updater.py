"""Updaters (SINGA's update rules) and learning-rate generators (src/utils/updater.cc), in place on float32.

`create_updater(UpdaterProto)` gives an `Updater`; the server keeps the updater buffers of each
slice (`new_state`) and calls `update_many(step, slices)` on the slices whose gradients of a
step are summed (`update(step, data, grad, buffers, ...)` each, or one GPU launch for them).
Arithmetic follows SINGA's float32 expressions term by term (SGD and Nesterov without decay
fold grad_scale into lr, one rounding apart), and a step's result depends only on its inputs:
same inputs, same bytes.
"""

import math

import numpy as np

from singa.device import is_host, on
from singa.errors import CheckpointError, ConfigError, NonFiniteError
from singa.proto import job_pb2
from singa.train import updater_cuda as cu

F32 = np.float32
#: the buckets of slices an Updater keeps the GPU tables of (a server's buckets of a step, of
#: each worker group it serves)
MAX_BUCKETS = 8


def create_lr_generator(proto):
    """The LRGenerator for an LRGenProto; kUserChange, user_type and bad confs raise ConfigError."""
    if proto.user_type:
        raise ConfigError(f"updater.learning_rate: user_type '{proto.user_type}' is not a "
                          "built-in learning-rate generator")
    cls = _LR_GENERATORS.get(proto.type)
    if cls is None:
        raise ConfigError(f"updater.learning_rate: type {_enum_name(job_pb2.ChangeMethod, proto.type)} "
                          "is not supported; set learning_rate { type: kFixed|kStep|kLinear|"
                          "kExponential|kInverse|kInverseT|kFixedStep ... }")
    return cls(proto)


def create_updater(proto):
    """The Updater for an UpdaterProto; kUserUpdater, user_type and bad confs raise ConfigError."""
    if proto.user_type:
        raise ConfigError(f"updater: user_type '{proto.user_type}' is not a built-in updater")
    cls = _UPDATERS.get(proto.type)
    if cls is None:
        raise ConfigError(f"updater: type {_enum_name(job_pb2.UpdaterType, proto.type)} is not "
                          "supported; set type: kSGD|kNesterov|kAdaGrad|kRMSProp|kAdaDelta|"
                          "kAdam|kAdamMax")
    return cls(proto)


# ---------------------------------------------------------------- learning-rate generators
# SINGA computes each schedule in double from float fields and returns a C float; so do we.

class LRGenerator:
    """`gen(step) -> float` learning rate; `get_index`/`set_index`: the position in the
    schedule a resume needs (the LR index of a snapshot)."""

    #: the rate is a function of the step alone (not of the calls before, as kFixedStep's)
    of_step = True

    def __init__(self, proto):
        self.proto = proto
        self.base_lr = proto.base_lr

    def get_index(self):
        """Schedules of the step alone have no position: 0."""
        return 0

    def set_index(self, index):
        """Schedules of the step alone have nothing to restore."""


class FixedLRGen(LRGenerator):
    """lr = base_lr"""

    def __call__(self, step):
        return self.base_lr


class StepLRGen(LRGenerator):
    """lr = base_lr * gamma^(step // change_freq)  (integer division, as Caffe)"""

    def __init__(self, proto):
        super().__init__(proto)
        self.gamma = proto.step_conf.gamma
        self.freq = _positive(proto.step_conf.change_freq, "step_conf.change_freq")

    def __call__(self, step):
        return _f32(self.base_lr * _pow(self.gamma, step // self.freq))


class LinearLRGen(LRGenerator):
    """r = step / change_freq; lr = (1 - r) * base_lr + r * final_lr  (not clamped beyond r = 1)"""

    def __init__(self, proto):
        super().__init__(proto)
        self.final_lr = proto.linear_conf.final_lr
        self.freq = _positive(proto.linear_conf.change_freq, "linear_conf.change_freq")

    def __call__(self, step):
        r = _f32(step / self.freq)  # SINGA keeps r in a float
        return _f32((1.0 - r) * self.base_lr + r * self.final_lr)


class ExpLRGen(LRGenerator):
    """lr = base_lr / 2^(step / change_freq)"""

    def __init__(self, proto):
        super().__init__(proto)
        self.freq = _positive(proto.exponential_conf.change_freq, "exponential_conf.change_freq")

    def __call__(self, step):
        return _f32(self.base_lr / _pow(2.0, step / self.freq))


class InvLRGen(LRGenerator):
    """lr = base_lr * (1 + gamma * step)^(-pow)"""

    def __init__(self, proto):
        super().__init__(proto)
        if proto.inverse_conf.gamma < 0:     # 1 + gamma·step would reach 0, then go below
            raise ConfigError(f"updater.learning_rate.inverse_conf.gamma must be >= 0 (got "
                              f"{proto.inverse_conf.gamma:g})")
        self.gamma = F32(proto.inverse_conf.gamma)
        self.pow = proto.inverse_conf.pow

    def __call__(self, step):
        with np.errstate(over="ignore"):   # float overflow: inf, as in SINGA's float
            x = F32(1) + self.gamma * F32(step)  # `1.f + gamma * step` is float arithmetic in SINGA
        return _f32(self.base_lr * _pow(float(x), -self.pow))


class InvTLRGen(LRGenerator):
    """lr = base_lr / (1 + step / final_lr)"""

    def __init__(self, proto):
        super().__init__(proto)
        self.final_lr = _positive(proto.inverset_conf.final_lr, "inverset_conf.final_lr")

    def __call__(self, step):
        return _f32(self.base_lr / (1.0 + step / self.final_lr))


class FixedStepLRGen(LRGenerator):
    """lr = step_lr[i]; i starts at 0 and each call advances it by at most one, when
    step >= step[i+1] (SINGA's behaviour: a fresh generator at a large step lags a few calls).
    `base_lr` is ignored. The index i is the LR index saved in snapshots."""

    of_step = False

    def __init__(self, proto):
        super().__init__(proto)
        conf = proto.fixedstep_conf
        self.steps = list(conf.step)
        self.lrs = list(conf.step_lr)
        if not self.steps or len(self.steps) != len(self.lrs):
            raise ConfigError("updater.learning_rate.fixedstep_conf needs as many step_lr as "
                              f"step values, at least one (got {len(self.steps)} step, "
                              f"{len(self.lrs)} step_lr)")
        self.idx = 0

    def __call__(self, step):
        if self.idx < len(self.steps) - 1 and step >= self.steps[self.idx + 1]:
            self.idx += 1
        return self.lrs[self.idx]

    def get_index(self):
        return self.idx

    def set_index(self, index):
        if not 0 <= index < len(self.steps):
            raise CheckpointError(f"kFixedStep learning-rate index {index} is outside the "
                                  f"{len(self.steps)} steps of fixedstep_conf")
        self.idx = int(index)


_LR_GENERATORS = {
    job_pb2.kFixed: FixedLRGen,
    job_pb2.kStep: StepLRGen,
    job_pb2.kLinear: LinearLRGen,
    job_pb2.kExponential: ExpLRGen,
    job_pb2.kInverse: InvLRGen,
    job_pb2.kInverseT: InvTLRGen,
    job_pb2.kFixedStep: FixedStepLRGen,
}


# ---------------------------------------------------------------- updaters

class Updater:
    """SINGA's prelude then a subclass's rule, all in place:

        lr = LR(step) * lr_scale;  wd = weight_decay * wd_scale
        [clips] if clip_high > clip_low: g = clamp(g, clip_low, clip_high)
        g = g * grad_scale
        if wd > 0: g = g + wd * w
        rule(w, g, buffers, lr)

    `grad` is used as scratch. The weight-decay term takes one more param-sized array from the
    Updater's scratch array (each server owns its Updater), which grows to the largest param
    and is then reused. On a GPU the prelude and rule are one kernel (`singa.train.updater_cuda`,
    the subclass's `fused`), with the same bits, launched once for the slices of a bucket.
    """
    clips = False   # SINGA clips only in SGD, Nesterov, AdaGrad and RMSProp
    linear = False  # rule is linear in g: grad_scale can fold into lr when there is no decay
    nstate = 1      # buffers per param: [history] or [history, update]

    def __init__(self, proto):
        self.proto = proto
        self.lr_gen = create_lr_generator(proto.learning_rate)
        self.momentum = F32(proto.momentum)
        self.weight_decay = F32(proto.weight_decay)
        self.delta = F32(proto.delta)
        self.clip = ((F32(proto.clip_low), F32(proto.clip_high))
                     if self.clips and proto.clip_high > proto.clip_low else None)
        self._buf = None            # scratch of the weight-decay term (each server owns its Updater)
        self._rate = (None, None)   # (step, its float32 learning rate) of the last update
        self._launch = None         # the GPU kernel's arguments that stay (cu.rule)
        self._buckets = {}          # the slices updated together on a GPU -> their cu.Bucket

    def new_state(self, shape, xp=np):
        """Zeroed float32 buffers the rule keeps between steps (SINGA's history/update), made
        by array module `xp` (numpy, or cupy for a param on a GPU)."""
        return [xp.zeros(shape, np.float32) for _ in range(self.nstate)]

    def update(self, step, data, grad, buffers, lr_scale=1.0, wd_scale=1.0, grad_scale=1.0):
        """Apply one step to `data` in place; `grad` is overwritten; `buffers` (the slice's,
        from new_state) are updated."""
        lr = self._lr(step) * F32(lr_scale)
        wd = self.weight_decay * F32(wd_scale)
        scale = F32(grad_scale)
        fold = self.linear and not wd > 0
        if fold:
            # lr*(s*g) == (lr*s)*g up to one rounding: saves a full pass over the param
            lr = lr * scale
        if not is_host(data) and all(a.flags.c_contiguous for a in (data, grad, *buffers)):
            if self._launch is None:
                self._launch = cu.rule(*self.fused(), self.clip)
            cu.update(self._launch, data, grad, buffers, lr,
                      None if fold or scale == 1 else scale, wd if not fold and wd > 0 else None)
            return
        if self.clip is not None:
            np.clip(grad, *self.clip, out=grad)
        if not fold:
            if scale != 1:
                grad *= scale
            if wd > 0:
                t = self._scratch(data)
                np.multiply(data, wd, out=t)
                grad += t
        self._rule(data, grad, buffers, lr)

    def update_many(self, step, slices):
        """`update(step, *s)` for each of `slices` [(data, grad, buffers, lr_scale, wd_scale,
        grad_scale)], on its data's device: in one launch where they are C-contiguous on a
        GPU."""
        bucket = self._bucket(slices)
        grads = [g for _, g, *_ in slices]
        if bucket is None or not all(not is_host(g) and g.flags.c_contiguous for g in grads):
            for s in slices:
                with on(s[0]):
                    self.update(step, *s)
            return
        bucket.update(self._launch, grads, self._lr(step), self.linear)

    def _bucket(self, slices):
        """The cu.Bucket of two or more slices whose data and buffers are C-contiguous on a
        GPU (checked once, when it is made), else None."""
        if len(slices) < 2 or is_host(slices[0][0]):
            return None
        key = tuple((id(d), *map(id, b), *scales) for d, _, b, *scales in slices)
        bucket = self._buckets.get(key)
        if bucket is not None or not all(not is_host(a) and a.flags.c_contiguous
                                         for d, _, b, *_ in slices for a in (d, *b)):
            return bucket
        if len(self._buckets) >= MAX_BUCKETS:
            self._buckets.clear()
        if self._launch is None:
            self._launch = cu.rule(*self.fused(), self.clip)
        bucket = self._buckets[key] = cu.Bucket(     # it holds the arrays: their ids stay theirs
            [(d, b, F32(lr_scale), F32(grad_scale), self.weight_decay * F32(wd_scale))
             for d, _, b, lr_scale, wd_scale, grad_scale in slices])
        return bucket

    def _lr(self, step):
        """F32(LR(step)): once a step where the schedule is of the step alone (a server's
        updates of a step share it)."""
        at, rate = self._rate
        if at != step or not self.lr_gen.of_step:
            rate = F32(self.lr_gen(step))
            if not math.isfinite(rate):
                kind = _enum_name(job_pb2.ChangeMethod, self.lr_gen.proto.type)
                raise NonFiniteError(f"step {step}: the learning rate is {rate} (updater."
                                     f"learning_rate {kind}: beyond a float's range)")
            self._rate = (step, rate)
        return rate

    def _scratch(self, like):
        if self._buf is None or self._buf.size < like.size or is_host(self._buf) != is_host(like):
            self._buf = np.empty_like(like, shape=like.size)    # on like's device
        return self._buf[:like.size].reshape(like.shape)


class SGDUpdater(Updater):
    """momentum > 0: h = momentum*h - lr*g; w = w + h.   Otherwise w = w - lr*g (no buffer)."""
    clips = True
    linear = True

    def __init__(self, proto):
        super().__init__(proto)
        self.nstate = 1 if self.momentum > 0 else 0

    def fused(self):
        """(the rule's updater_cuda kernel case, its constants)"""
        return (cu.MOMENTUM, (self.momentum,)) if self.nstate else (cu.SGD, ())

    def _rule(self, w, g, buffers, lr):
        g *= lr
        if self.nstate:
            h = buffers[0]
            h *= self.momentum
            h -= g
            w += h
        else:
            w -= g


class NesterovUpdater(Updater):
    """h_old = h; h = momentum*h + lr*g; w = w - ((1+momentum)*h - momentum*h_old)"""
    clips = True
    linear = True

    def fused(self):
        return cu.NESTEROV, (self.momentum, F32(1) + self.momentum)

    def _rule(self, w, g, buffers, lr):
        h = buffers[0]
        t = self._scratch(w)
        g *= lr
        h *= self.momentum          # momentum*h_old: both terms of the rule use this product
        g += h                      # g is now the new history
        np.multiply(g, F32(1) + self.momentum, out=t)
        t -= h
        w -= t
        np.copyto(h, g)


class AdaGradUpdater(Updater):
    """h = h + g^2; w = w - lr*g / sqrt(h + 1e-8).

    delta is always 1e-8: SINGA 0.3 reads it from `Updater::proto_`, which is never assigned,
    so the configured `delta` is ignored. Kept on purpose for identical training."""
    clips = True
    delta_fixed = F32(1e-8)

    def fused(self):
        return cu.ADAGRAD, (self.delta_fixed,)

    def _rule(self, w, g, buffers, lr):
        h = buffers[0]
        t = self._scratch(w)
        np.square(g, out=t)
        h += t
        _apply_scaled(w, g, h, self.delta_fixed, t, lr)


class RMSPropUpdater(Updater):
    """h = rho*h + (1-rho)*g^2; w = w - lr*g / sqrt(h + delta)"""
    clips = True

    def __init__(self, proto):
        super().__init__(proto)
        if not proto.HasField("rmsprop_conf"):
            raise ConfigError("updater: kRMSProp needs rmsprop_conf { rho: ... }")
        self.rho = F32(proto.rmsprop_conf.rho)

    def fused(self):
        return cu.RMSPROP, (self.delta, self.rho, F32(1) - self.rho)

    def _rule(self, w, g, buffers, lr):
        h = buffers[0]
        t = self._scratch(w)
        _moving_avg(h, self.rho, np.square(g, out=t), t)
        _apply_scaled(w, g, h, self.delta, t, lr)


class AdaDeltaUpdater(Updater):
    """h = rho*h + (1-rho)*g^2; t = g*sqrt(u + delta)/sqrt(h + delta);
    u = rho*u + (1-rho)*t^2; w = w - lr*t"""
    nstate = 2

    def __init__(self, proto):
        super().__init__(proto)
        self.rho = F32(proto.adadelta_conf.rho)

    def fused(self):
        return cu.ADADELTA, (self.delta, self.rho, F32(1) - self.rho)

    def _rule(self, w, g, buffers, lr):
        h, u = buffers
        t = self._scratch(w)
        _moving_avg(h, self.rho, np.square(g, out=t), t)
        g *= _sqrt_plus(u, self.delta, t)
        g /= _sqrt_plus(h, self.delta, t)
        _moving_avg(u, self.rho, np.square(g, out=t), t)
        g *= lr
        w -= g


class AdamUpdater(Updater):
    """h = b1*h + (1-b1)*g; u = b2*u + (1-b2)*g^2; w = w - lr*h / sqrt(u + delta)
    (no bias correction, as SINGA)"""
    nstate = 2

    def __init__(self, proto):
        super().__init__(proto)
        self.beta1 = F32(proto.adam_conf.beta1)
        self.beta2 = F32(proto.adam_conf.beta2)

    def fused(self):
        return cu.ADAM, (self.delta, F32(1) - self.beta1, F32(1) - self.beta2, self.beta1,
                         self.beta2)

    def _rule(self, w, g, buffers, lr):
        h, u = buffers
        t = self._scratch(w)
        _moving_avg(h, self.beta1, g, t)
        _moving_avg(u, self.beta2, np.square(g, out=t), t)
        np.multiply(h, lr, out=g)
        g /= _sqrt_plus(u, self.delta, t)
        w -= g


class AdamMaxUpdater(Updater):
    """h = b1*h + (1-b1)*g; u = max(b2*u, |g|) + delta; w = w - lr*h / u"""
    nstate = 2

    def __init__(self, proto):
        super().__init__(proto)
        self.beta1 = F32(proto.adammax_conf.beta1)
        self.beta2 = F32(proto.adammax_conf.beta2)

    def fused(self):
        return cu.ADAMMAX, (self.delta, F32(1) - self.beta1, self.beta2, self.beta1)

    def _rule(self, w, g, buffers, lr):
        h, u = buffers
        t = self._scratch(w)
        _moving_avg(h, self.beta1, g, t)
        u *= self.beta2
        np.maximum(u, np.abs(g, out=g), out=u)
        u += self.delta
        np.multiply(h, lr, out=g)
        g /= u
        w -= g


_UPDATERS = {
    job_pb2.kSGD: SGDUpdater,
    job_pb2.kNesterov: NesterovUpdater,
    job_pb2.kAdaGrad: AdaGradUpdater,
    job_pb2.kRMSProp: RMSPropUpdater,
    job_pb2.kAdaDelta: AdaDeltaUpdater,
    job_pb2.kAdam: AdamUpdater,
    job_pb2.kAdamMax: AdamMaxUpdater,
}


def _moving_avg(acc, rho, x, t):
    """acc = rho*acc + (1-rho)*x in place; `t` is scratch and may be `x` itself."""
    np.multiply(x, F32(1) - rho, out=t)
    acc *= rho
    acc += t


def _sqrt_plus(x, delta, out):
    """out = sqrt(x + delta): mshadow's sqrtop."""
    np.add(x, delta, out=out)
    return np.sqrt(out, out=out)


def _apply_scaled(w, g, h, delta, t, lr):
    """w = w - lr*g / sqrt(h + delta), using g and t as scratch."""
    g *= lr
    g /= _sqrt_plus(h, delta, t)
    w -= g


def _positive(value, field):
    if value <= 0:
        raise ConfigError(f"updater.learning_rate.{field} must be > 0 (got {value})")
    return value


def _enum_name(enum, value):
    try:
        return enum.Name(value)
    except ValueError:
        return str(value)


def _f32(x):
    """x rounded to a C float, as SINGA's generators return (±inf beyond its range)."""
    with np.errstate(over="ignore"):
        return float(F32(x))


def _pow(x, y):
    """x ** y in double, inf beyond its range (where Python's float raises; a rate of either
    sign there stops the job alike: `Updater._lr`)."""
    try:
        return x ** y
    except OverflowError:
        return math.inf
