"""infer: an LLM inference microservice."""
