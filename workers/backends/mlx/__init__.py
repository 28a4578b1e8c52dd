"""The MLX backend (Metal on macOS, CUDA on Linux, CPU fallback): GGUF loading, batching."""
