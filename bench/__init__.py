"""Benchmarks of formula-runtime against NumPy, ONNX Runtime and PyTorch (see README.md)."""
