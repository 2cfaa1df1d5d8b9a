"""Layers; importing this package registers every built-in layer type (see base.create_layer)."""
from singa.layers import connection, conv, input, loss, neuron, norm, output, rbm, rnn  # noqa: F401
