"""The gRPC stubs generated from `proto/` (one subpackage per proto version) and their generator."""
