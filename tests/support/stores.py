"""SQLite MLflow stores for tests, each a copy of one store MLflow migrated once per test process."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

# Where sqlite_uri keeps its migrated empty store: set by conftest's session fixture, once per process
_TEMPLATE_FOLDER: list[Path] = []


def sqlite_uri(path: Path) -> str:
    """The URI of a SQLite MLflow store at ``path``, each test's own. A new store is a copy of one that
    MLflow created and migrated once per test process: its migrations cost each process that opens a new
    file about 3 s of CPU (tests/test_first_hour.py still starts from no file, as a new user does). The
    copy's Default experiment keeps its artifacts where MLflow would have put them for a new file:
    ``mlruns/0`` under the working folder of the moment, not the template's."""
    path = Path(path)
    if not path.exists():
        template = _TEMPLATE_FOLDER[-1] / "mlflow.db"
        if not template.exists():
            from mlflow.tracking import MlflowClient

            MlflowClient(f"sqlite:///{template}").search_experiments()
        shutil.copyfile(template, path)
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            default = str(Path.cwd() / "mlruns" / "0")
            db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0", (default,))
    return f"sqlite:///{path}"
