"""Generated gRPC stubs of the infer.v1 proto. Do not edit: run `make proto`."""
