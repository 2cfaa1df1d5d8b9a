"""Watching a run: metrics.csv and History, TensorBoard events, plots."""
