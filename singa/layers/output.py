"""Output layers: ArgSort, Accuracy, and CSVOutput / RecordOutput writing a store (src/neuralnet/output_layer/)."""
import numpy as np

from singa import resolve
from singa.device import assign, host
from singa.errors import ConfigError
from singa.io.store import open_store
from singa.layers.base import Layer, register
from singa.proto import common_pb2, job_pb2

__all__ = ["ArgSortLayer", "AccuracyLayer", "CSVOutputLayer", "RecordOutputLayer", "top_indices"]


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
        self.data = self.xp.zeros((n, self.topk), np.float32)

    def compute_feature(self, flag, srclayers):
        x = host(srclayers[0].data_for(self))
        assign(self.data, top_indices(x.reshape(x.shape[0], -1), self.topk))


@register(job_pb2.kAccuracy)
class AccuracyLayer(ArgSortLayer):
    """Sources [scores, label provider]: metric accuracy = fraction of rows with the label in the top-k."""
    METRICS = ("accuracy",)

    sources = (2, 2)

    def setup(self, srclayers):
        super().setup(srclayers[:1])

    def compute_feature(self, flag, srclayers):
        super().compute_feature(flag, srclayers)
        labels = srclayers[1].aux_data
        hits = np.count_nonzero((host(self.data) == labels[:, None]).any(axis=1))
        self.add_metrics({"accuracy": hits / self.data.shape[0]})


class StoreOutputLayer(Layer):
    """Writes one store tuple per instance of its source, keyed by a running counter ("0", "1",
    ...); the store at store_conf.path is created (truncated) by the first forward pass."""

    default_backend = None

    sources = (1, 1)

    def setup(self, srclayers):
        sc = self.conf.store_conf
        self.backend = sc.backend or self.default_backend
        for field, value in (("backend", self.backend), ("path", sc.path)):
            if not value:
                raise ConfigError(f"layer '{self.name}': store_conf.{field} is not set")
        self.path = resolve(sc.path)
        self.store = None
        self.count = 0

    def compute_feature(self, flag, srclayers):
        if self.store is None:
            self.store = open_store(self.backend, self.path, "create")
        x = host(srclayers[0].data_for(self))
        labels = srclayers[0].aux_data
        rows = x.reshape(len(x), -1)
        for i, row in enumerate(rows):
            label = None if labels is None else int(labels[i])
            self.store.write(b"%d" % self.count, self.encode(row, label))
            self.count += 1
        self.store.flush()

    def close(self):
        if self.store is not None:
            self.store.close()
            self.store = None

    def encode(self, row, label):
        """The store value of one instance."""
        raise NotImplementedError


@register(job_pb2.kCSVOutput)
class CSVOutputLayer(StoreOutputLayer):
    """One text line per instance, `label,v1,...,vD` (the label only when the source has labels),
    values printed as C's %f. SINGA turns a set store_conf.backend into a bogus one; here it
    must be unset or "textfile"."""

    default_backend = "textfile"

    def setup(self, srclayers):
        super().setup(srclayers)
        if self.backend != "textfile":
            raise ConfigError(f"layer '{self.name}': kCSVOutput writes text; store_conf.backend "
                              f"must be \"textfile\" or unset, not {self.backend!r}")

    def encode(self, row, label):
        values = ",".join("%f" % v for v in row.tolist())
        return (values if label is None else f"{label},{values}").encode()


@register(job_pb2.kRecordOutput)
class RecordOutputLayer(StoreOutputLayer):
    """One RecordProto per instance: `data` = its values, `label` when the source has labels."""

    def encode(self, row, label):
        rec = common_pb2.RecordProto(data=row)
        if label is not None:
            rec.label = label
        return rec.SerializeToString()
