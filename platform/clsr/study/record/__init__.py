"""The study's MLflow record as policy: who holds a study (the lease), the parent run's life, what is kept."""
