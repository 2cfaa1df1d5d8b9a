"""The Python API's machinery: the session that runs a JobProto in-process, SINGA's proto
builders, data feeding."""
