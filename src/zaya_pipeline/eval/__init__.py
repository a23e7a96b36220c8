"""Evaluation: held-out loss, perplexity and bits-per-byte."""
