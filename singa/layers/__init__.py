"""Layers; importing this package registers every built-in layer type (see base.create_layer)."""
from singa.layers import (connection, conv, input, loss, neuron, norm, output,  # noqa: F401
                          parser, rbm, rnn)
