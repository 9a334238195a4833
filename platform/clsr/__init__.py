"""clsr: contrastive sentence-representation research on Ray Tune, Ray Train and MLflow."""

__version__ = "0.1.0"
