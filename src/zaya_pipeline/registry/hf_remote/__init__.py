"""Remote code that ``zaya export`` copies into every Hugging Face folder (not imported by the pipeline)."""
