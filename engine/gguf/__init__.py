"""GGUF files (llama.cpp's format) as a model source: metadata, tokenizer, tensors with their own bits."""
