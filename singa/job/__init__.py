"""Job configuration: the conf rules, protobuf text format, cluster topology, the workspace."""
