"""Messaging between workers, servers and stubs over ZeroMQ (SINGA's comm/)."""
