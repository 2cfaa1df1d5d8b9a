"""Training: this process's runtime, the worker loop, servers, updaters, monitor, evaluation."""
