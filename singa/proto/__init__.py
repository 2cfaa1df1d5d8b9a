"""Generated protobuf modules (proto/*.proto → proto/generate.sh); never edit the *_pb2.py by hand."""
