"""zaya_pipeline: raw text to a registered, evaluated ZAYA1-style MoE language model.

Importing the package is cheap and never needs a GPU or Triton: stages import their heavy dependencies lazily.
"""

__version__ = "0.1.0"
