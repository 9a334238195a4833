"""What the tests share: stores, tiny models, stub hub caches, the local SLURM daemons. Imported as
``tests.support.<module>`` (pytest's ``pythonpath`` has the repository root)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
