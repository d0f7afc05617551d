"""Built-in models for the demo, the tests and the benchmarks (PyTorch, random weights)."""
