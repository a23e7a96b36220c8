"""Autograd ops over the kernels with a guarded import and a plain-torch fallback."""
