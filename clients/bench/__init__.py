"""`infer bench`: a load generator for the gRPC `Generate` stream and the OpenAI HTTP endpoints.

A client: it speaks the proto and HTTP, never imports the engine or torch.
"""
