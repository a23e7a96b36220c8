"""Triton kernels only (@triton.jit); never imported by CPU-only code paths."""
