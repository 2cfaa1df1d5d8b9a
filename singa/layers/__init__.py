"""Layers; importing this package registers every built-in layer type (see base.create_layer)."""
from singa.layers import (caffe, connection, conv, input, loss, neuron, norm,  # noqa: F401
                          output, parser, pooling, rbm, rnn)
