"""MLflow: tracking setup, model logging and registration."""
