"""The Python API's machinery: the session that runs a JobProto in-process."""
