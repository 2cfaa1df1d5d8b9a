"""Output layers: ArgSort and Accuracy (src/neuralnet/output_layer/)."""
import numpy as np

from singa.errors import ConfigError
from singa.layers.base import Layer, register
from singa.proto import job_pb2

__all__ = ["ArgSortLayer", "AccuracyLayer", "top_indices"]


def top_indices(x, k):
    """Indices of the k largest values per row of 2-D x, descending; ties: higher index first.

    That is SINGA's order: partial_sort of (value, index) pairs with std::greater.
    """
    dim = x.shape[1]
    # A stable sort of the reversed row puts the higher original index first among ties.
    order = np.argsort(-x[:, ::-1], axis=1, kind="stable")[:, :k]
    return dim - 1 - order


@register(job_pb2.kArgSort)
class ArgSortLayer(Layer):
    """data (N, topk) = indices (as floats) of the top-k source values per row, descending."""

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        n = src.shape[0]
        self.topk = self.conf.argsort_conf.topk
        if not 0 < self.topk <= src.size // n:
            raise ConfigError(f"layer '{self.name}': argsort_conf.topk {self.topk} must be in "
                              f"[1, {src.size // n}]")
        self.data = np.zeros((n, self.topk), np.float32)

    def compute_feature(self, flag, srclayers):
        x = srclayers[0].data_for(self)
        self.data[...] = top_indices(x.reshape(x.shape[0], -1), self.topk)


@register(job_pb2.kAccuracy)
class AccuracyLayer(ArgSortLayer):
    """Sources [scores, label provider]: accuracy += fraction of rows with the label in the top-k."""

    def setup(self, srclayers):
        if len(srclayers) != 2:
            raise ConfigError(f"layer '{self.name}' needs 2 srclayers (scores, labels), "
                              f"got {len(srclayers)}")
        super().setup(srclayers[:1])
        self.accuracy = 0.0
        self.counter = 0

    def compute_feature(self, flag, srclayers):
        super().compute_feature(flag, srclayers)
        labels = srclayers[1].aux_data
        hits = np.count_nonzero((self.data == labels[:, None]).any(axis=1))
        self.accuracy += hits / self.data.shape[0]
        self.counter += 1

    def to_string(self, flag):
        """`accuracy = %f` averaged since the last call; resets the average."""
        if not self.counter:
            return ""
        text = f"accuracy = {self.accuracy / self.counter:f}"
        self.accuracy = 0.0
        self.counter = 0
        return text
