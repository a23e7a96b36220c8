"""Device mesh and parallelize_zaya (expert parallel, activation checkpointing, compile, FSDP2)."""
