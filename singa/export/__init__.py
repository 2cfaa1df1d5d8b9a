"""Export a job's test net with a snapshot's values: `onnx`, `caffe`, both from `graph`."""
