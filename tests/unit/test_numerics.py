"""numerics: a nan or inf loss names the step and where the bad values start; params are checked
before a snapshot."""
import types

import numpy as np
import pytest

from singa.errors import NonFiniteError
from singa.net import numerics


def layer(name, data, params=(), **metric_sums):
    return types.SimpleNamespace(name=name, data=np.asarray(data, np.float32),
                                 params=[types.SimpleNamespace(name=n, data=np.asarray(v, np.float32))
                                         for n, v in params], metric_sums=metric_sums)


def net(*layers):
    return types.SimpleNamespace(layers=list(layers))


def test_finite_losses_pass():
    numerics.check_loss(net(layer("data", [1.0]), layer("loss", [0.5], Loss=0.3, accuracy=0.5),
                            layer("rbm", [0.1], **{"Squared Error": np.float64(2.0)})), 3)


@pytest.mark.parametrize("layers, where", [
    ((layer("data", [1.0, np.nan]), layer("ip", [np.nan], [("w", [np.nan])])),
     "the first non-finite values are in the output of layer 'data'"),
    ((layer("data", [1.0]), layer("ip", [np.nan], [("b", [0.0]), ("w", [np.inf])])),
     "the first non-finite values are in param 'w' of layer 'ip'"),
    ((layer("data", [1.0]),), "every param and layer output is finite")])
def test_a_non_finite_loss_names_step_and_where_it_starts(layers, where):
    with pytest.raises(NonFiniteError, match=rf"^step 7: the loss of layer 'loss' is nan; {where}$"):
        numerics.check_loss(net(*layers, layer("loss", [0.0], Loss=np.float64(np.nan))), 7)


def test_a_non_finite_reconstruction_error_is_caught():
    with pytest.raises(NonFiniteError, match=r"^step 2: the squared error of layer 'vis' is inf"):
        numerics.check_loss(net(layer("vis", [0.0], **{"Squared Error": float("inf")})), 2)


def test_check_params_names_the_first_bad_param():
    params = layer("ip", [0.0], [("w", [1.0]), ("b", [np.nan]), ("c", [np.inf])]).params
    with pytest.raises(NonFiniteError, match=r"^step 40: param 'b' holds nan or inf; no snapshot written$"):
        numerics.check_params(params, 40)
    numerics.check_params(params[:1], 40)
