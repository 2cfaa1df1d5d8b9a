"""SINGA's phase rule: which layers of a NetProto the net of a phase holds."""

__all__ = ["in_phase"]


def in_phase(layer, phase):
    """Whether LayerProto `layer` is in the net of `phase` (a job_pb2.Phase): `exclude`
    removes it from the phases it lists; a non-empty `include` keeps it in those alone."""
    return phase not in layer.exclude and (not layer.include or phase in layer.include)
