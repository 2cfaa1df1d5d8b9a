"""fit's schedule: its arguments (nb_epoch or epochs, with_test, the data given, the JobProto
fields it is told) as the job's train steps and the frequencies and lengths of its displays,
validations and tests; and the check that the net it trains learns (a loss layer)."""
import numpy as np

from singa.api import feed
from singa.api.session import STORE_INPUTS
from singa.errors import ConfigError
from singa.net.phase import in_phase
from singa.proto import job_pb2

#: the loss layers of a net trained by back-propagation
LOSSES_OF_BP = (job_pb2.kSoftmaxLoss, job_pb2.kCudnnSoftmaxLoss, job_pb2.kEuclideanLoss,
                job_pb2.kMSELoss)


def check_epochs(epochs, nb_epoch):
    """fit's `epochs` (passes over the data given), when given: a positive int, and no
    `nb_epoch` (steps) besides."""
    if epochs is None:
        return
    if nb_epoch:
        raise ConfigError("fit: give epochs (passes over numpy data) or nb_epoch (steps), "
                          "not both")
    if not isinstance(epochs, (int, np.integer)) or epochs <= 0:
        raise ConfigError(f"fit: epochs (passes over the data) must be a positive int, "
                          f"got {epochs!r}")


def check_count(what, name, value):
    """A count of batches (`steps_per_epoch`, `validation_steps`, `steps`): None or a
    positive int."""
    if value is not None and (not isinstance(value, (int, np.integer)) or value <= 0):
        raise ConfigError(f"{what}: {name} (a number of batches) must be a positive int, got "
                          f"{value!r}")


def pulls(nb_epoch, epochs, steps_per_epoch):
    """(the batches fit takes of an iterable of train batches, whether exactly): Keras'
    `steps_per_epoch` batches for each of the `epochs` (each pass its own batches: a
    generator's augmentation stays per epoch), else at most `nb_epoch` (steps), else all."""
    if steps_per_epoch is not None:
        return steps_per_epoch * (epochs or 1) if not nb_epoch else nb_epoch, True
    return (nb_epoch or None), False


def train_steps(nb_epoch, epochs, per_pass, from_conf):
    """The train steps fit asks for: `epochs` passes of `per_pass` steps, else `nb_epoch` (0:
    the train_steps of a model's conf, `from_conf`)."""
    if epochs is not None:
        nb_epoch = int(epochs) * per_pass
    if not isinstance(nb_epoch, (int, np.integer)) or not 0 <= nb_epoch < 2**31 \
            or (nb_epoch == 0 and not from_conf):
        raise ConfigError(f"fit: nb_epoch (the number of training steps) must be a "
                          f"positive int below 2^31, got {nb_epoch!r}")
    return int(nb_epoch)


def plan(job, fields, steps, per_pass, with_test, validating, from_conf, streams):
    """Set `job` (its net built) to train `steps` steps (0: as a conf's job says), displaying,
    validating (`validating`) and testing (`with_test`, when its net has test data) every pass
    (`per_pass` steps: at its end, `pass_ends`) or every tenth of the steps, unless `fields`
    (the JobProto fields fit was told) say otherwise: data given to fit (numpy, or iterables
    written in `streams`) are tested and validated whole, unless steps are asked for. A
    model's conf (`from_conf`) keeps its own display and tests."""
    if steps:
        job.train_steps = steps
    every = per_pass or max(1, job.train_steps // 10)
    if not from_conf and 'disp_freq' not in fields:
        job.disp_freq = every
    if validating:
        job.validate_freq = fields.get('validate_freq', every)
        job.validate_steps = feed.whole_pass(job.neuralnet, job_pb2.kVal,
                                             'validate_steps' in fields, streams)[0] \
            or fields.get('validate_steps', 10)
    has_test = any(in_phase(ly, job_pb2.kTest) and ly.type in STORE_INPUTS
                   for ly in job.neuralnet.layer)
    if with_test and has_test:
        job.test_steps = feed.whole_pass(job.neuralnet, job_pb2.kTest, 'test_steps' in fields,
                                         streams)[0] \
            or fields.get('test_steps', job.test_steps or 10)
        job.test_freq = fields.get('test_freq', job.test_freq or every)
    elif not from_conf:
        job.test_steps = 0
    if per_pass:
        pass_ends(job, fields, per_pass)
    job.test_at_end = True      # the History ends with the test of the params returned


def pass_ends(job, fields, per_pass):
    """fit(epochs=...): what runs once a pass (`per_pass` steps) runs at its end, as Keras
    logs an epoch: the display after the pass's last step (the mean over the pass: a display
    averages the steps since the one before), the validation and the test before the next
    pass's first step (the last pass's: test_at_end), unless `fields` give its `*_after`."""
    for kind, after in (('disp', per_pass - 1), ('validate', per_pass), ('test', per_pass)):
        if getattr(job, f'{kind}_freq') == per_pass and f'{kind}_after' not in fields:
            setattr(job, f'{kind}_after', after)


def check_loss(job):
    """A net trained by back-propagation needs a loss layer (or a user layer that may be one)."""
    if job.train_one_batch.alg == job_pb2.kCD:
        return
    if not any(ly.type in LOSSES_OF_BP or ly.type == job_pb2.kUserLayer
               or ly.HasField('user_type') for ly in job.neuralnet.layer):
        raise ConfigError(f"fit: model '{job.name}' has no loss layer, so training would change "
                          f"nothing: compile(loss='categorical_crossentropy' or "
                          f"'mean_squared_error', ...), or add a Loss layer")
