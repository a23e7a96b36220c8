"""Helpers for tests: tiny fixtures and markers."""
