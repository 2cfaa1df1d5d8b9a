"""Numerics of training: non-finite values (the loss every step, params before a snapshot),
the random streams a job draws from its seed, and the state of a random generator as a
snapshot stores it.

Cheap on the hot path: a step looks at the metric sums of its loss layers; arrays are
scanned only when a loss is nan or inf (to name where it started) and when a snapshot is
about to be written. On a GPU the host does not wait for the step it has just queued to look
at its loss (`LossCheck`).
"""
import contextlib
import math
import warnings

import numpy as np

from singa.device import Readback
from singa.errors import NonFiniteError


#: the streams a job spawns from its `seed`, in this order: the params' initial values, the
#: test net, the validation net, then one per worker of every group (`seeds`)
INIT, TEST, VALIDATION, WORKERS = 0, 1, 2, 3


def seeds(job, n):
    """`n` independent RNG streams from the job's `seed` (the clock when unset, as SINGA)."""
    seq = np.random.SeedSequence(job.seed if job.HasField("seed") else None)
    return [np.random.Generator(np.random.PCG64(s)) for s in seq.spawn(n)]


def check_loss(net, step, now=None):
    """NonFiniteError if a metric a layer sums between displays (a loss, RBMVis's squared
    error) is nan or inf, naming the first layer (in forward order) whose params or output hold
    such values (by step `now`, where the net has gone on since `step`)."""
    for layer in net.layers:
        if not layer.metric_sums or math.isfinite(sum(layer.metric_sums.values())):
            continue    # one read of a layer's sums (device scalars on a GPU: one wait)
        for name, value in layer.metric_sums.items():
            if not math.isfinite(value):
                where = first_non_finite(net)
                if now not in (None, step):
                    where = f"by step {now}, {where}"
                raise NonFiniteError(f"step {step}: the {name.lower()} of layer '{layer.name}' "
                                     f"is {float(value)}; {where}")


class LossCheck:
    """`check_loss` of a net after each step, `check(step)`. Sums on the host are looked at
    at once. Sums on a GPU are copied to the host without waiting and looked at when the
    next step has been queued (its `check`) or at `flush`, which whatever reads the net's
    params or metrics calls first (a test, a snapshot, a display): the host queues step s + 1
    while the GPU computes step s, where waiting for s's loss would leave the GPU idle while
    the host prepares s + 1."""

    def __init__(self, net):
        self.net = net
        self.copies = Readback()
        self.pending = None     # the step whose sums are being copied

    def check(self, step):
        self._look(step)
        on_host, on_device = [], []
        for layer in self.net.layers:
            for v in layer.metric_sums.values():
                (on_device if hasattr(v, "__cuda_array_interface__") else on_host).append(v)
        if on_device:
            self.copies.start(on_device)
            self.pending = step
        if not all(map(math.isfinite, on_host)):
            check_loss(self.net, step)

    def flush(self):
        """Look at the copied sums of the last step checked (waiting for the GPU to reach
        them); NonFiniteError as `check_loss`."""
        self._look(None)

    def _look(self, now):
        if self.pending is None:
            return
        step, self.pending = self.pending, None
        if not all(np.isfinite(v).all() for v in self.copies.values()):
            check_loss(self.net, step, now)     # the sums keep a nan or inf until displayed
            raise NonFiniteError(f"step {step}: a loss is nan or inf")


@contextlib.contextmanager
def quiet_float_warnings():
    """While a job runs: no numpy RuntimeWarning for a float overflow, invalid value or
    division by zero in singa's own modules. A non-finite value that reaches a loss or a
    param stops the job with its own line (`check_loss`, `check_params`); one that does not
    is no fault (exp(-x) overflowing in a sigmoid, whose 1 / (1 + inf) is 0)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"(overflow|invalid value|divide by zero) encountered",
                                RuntimeWarning, r"singa\.")
        yield


def check_params(params, step):
    """NonFiniteError naming the first of `params` that holds nan or inf."""
    for p in params:
        if not np.isfinite(p.data).all():
            raise NonFiniteError(f"step {step}: param '{p.name}' holds nan or inf; no snapshot "
                                 f"written")


def first_non_finite(net):
    """Where nan or inf first appears in a forward pass of `net`: a param or a layer output."""
    for layer in net.layers:
        for p in layer.params:
            if not np.isfinite(p.data).all():
                return f"the first non-finite values are in param '{p.name}' of layer '{layer.name}'"
        data = layer.data
        if hasattr(data, "dtype") and data.dtype.kind == "f" and not np.isfinite(data).all():
            return f"the first non-finite values are in the output of layer '{layer.name}'"
    return "every param and layer output is finite"


def rng_state(rng):
    """Where numpy Generator `rng` (on PCG64, as the job's are) stands, as the fields of
    `RngState` (proto/common.proto): {"bit_generator": "PCG64", "state": 16 bytes, "inc": 16
    bytes (128-bit little-endian), "has_uint32": 0 or 1, "uinteger": uint32}."""
    st = rng.bit_generator.state
    return {"bit_generator": st["bit_generator"],
            "state": st["state"]["state"].to_bytes(16, "little"),
            "inc": st["state"]["inc"].to_bytes(16, "little"),
            "has_uint32": st["has_uint32"], "uinteger": st["uinteger"]}


def set_rng_state(rng, fields):
    """Continue `rng` from `fields` (what `rng_state` gave); ValueError if they are none."""
    why = rng_state_problem(fields)
    if why is not None:
        raise ValueError(f"RNG state {why}")
    rng.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": int.from_bytes(fields["state"], "little"),
                  "inc": int.from_bytes(fields["inc"], "little")},
        "has_uint32": fields["has_uint32"], "uinteger": fields["uinteger"]}


def rng_state_problem(fields):
    """Why `fields` is no state `rng_state` could have given (a phrase: 'is for ...'), else None."""
    if fields["bit_generator"] != "PCG64":
        return f"is for {fields['bit_generator']!r}, not PCG64"
    if len(fields["state"]) != 16 or len(fields["inc"]) != 16 \
            or fields["has_uint32"] not in (0, 1):
        return "is not a PCG64 state (128-bit state and increment, has_uint32 0 or 1)"
    return None
