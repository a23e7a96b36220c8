"""Single-device MoE language model: attention, router, experts, transformer, parameter counts."""
