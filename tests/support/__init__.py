"""Helpers for the tests (not shipped): gloo process groups, log capture, the MLflow UI in a browser, a
throwaway git + DVC copy of the project."""
