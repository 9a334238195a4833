"""A study's results as a pandas DataFrame, for notebooks and scripts: ``clsr.results.load(study)``.

The public face of ``clsr.study.analyse.frame``, which documents the columns."""

from clsr.study.analyse.frame import load

__all__ = ["load"]
