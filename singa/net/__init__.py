"""The neural net of a phase: layer graph, partitioning, the phase rule, numerics."""
