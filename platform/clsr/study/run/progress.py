"""A quiet terminal for ``platform study run|resume``: Ray's and Tune's output goes to a file, and the
terminal gets the platform's own lines, a compact progress table and the study's summary.

Ray's knobs do most of it: Tune runs with ``verbose=0`` on its legacy output engine
(``RAY_AIR_NEW_OUTPUT=0``; the new one prints its results folder and a TensorBoard hint at any
verbosity), so it prints no trial tables, and Ray's Python loggers (``ray``, ``ray.tune``, ...) write to
``driver.log`` instead of the terminal. The workers' output (``log_to_driver``) reaches the driver through
Ray's stream dispatcher; it goes to the same file, except the platform's own lines (its warnings, MLflow
outages, a trial's time limit), which still reach the terminal. An error Ray or Tune logs is said in one
line with where the rest is, and a trial that fails is reported by ``Progress`` with its error and the
file holding its traceback. ``--verbose`` leaves all of this off: today's full output.
"""

from __future__ import annotations

import logging
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray.tune.progress_reporter import TrialProgressCallback

from clsr import runtime_dir

LOG_NAME = "driver.log"
TABLE_EVERY_S = 30.0
LABEL_WIDTH = (24, 72)  # the point column: at least, at most
ELLIPSIS = "…"
MAX_ROWS = 20  # a larger experiment's table: its running and failed trials first, then a count
SHOWN_FIRST = ["running", "error", "paused", "pending", "ended early", "finished"]

# Worker output the user must see: the platform's own warnings and notes (see the module docstring)
PLATFORM_LINES = re.compile(
    r"clsr[/\\][\w/\\]+\.py:\d+: \w*Warning: "  # warnings.warn from the platform's modules
    r"|^MLflow unreachable while |: trial_timeout_s=\S+ reached|^rcl: |^note: |^warning: "
)
# Errors Ray or Tune logs that the progress callback reports itself, or that a stop makes expected
REPORTED_ELSEWHERE = ("Trial task failed for trial", "Trials did not complete")
# Ray's messages to the driver that say nothing a study's user can act on
RAY_NOISE = re.compile(r"PYTHON worker processes have been started on node")


def log_path(storage: str, private: Path | None = None) -> Path:
    """Where the driver's Ray and Tune logs go: ``<storage>/driver.log`` for a local study folder, else
    (cloud storage) ``<private runtime folder>/runs/<run folder>/driver.log`` (``clsr.runtime_dir``,
    rule 1: the run folder's name is public in the record, so a shared /tmp would invite a planted link)."""
    if "://" in storage and not storage.startswith("file://"):
        name = storage.rstrip("/").rsplit("/", 1)[-1]
        runs = runtime_dir.subfolder(private or runtime_dir.root(), "runs")
        return runtime_dir.subfolder(runs, name) / LOG_NAME
    return Path(storage.removeprefix("file://")) / LOG_NAME


class DriverLog:
    """Ray's and Tune's log records, and Ray's workers' output, routed to a file.

    Until the file is known (the study's storage folder comes with its MLflow record) they are kept in
    memory; if the driver ends before that, they are written to stderr, so nothing is lost.
    """

    def __init__(self, echo: Callable[[str], None] | None = None) -> None:
        self.path: Path | None = None
        self._file = None
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._echo = echo or (lambda line: print(line, file=sys.stderr, flush=True))
        self._replaced: list[tuple[logging.Logger, logging.Handler]] = []
        self._handler = _Records(self)

    def start(self) -> None:
        """Take over Ray's loggers' terminal handlers (import ray first: it installs them)."""
        import ray  # noqa: F401  (its logging configuration is set up on import)

        loggers = [logging.getLogger("ray")]
        loggers += [
            logger
            for name, logger in sorted(logging.root.manager.loggerDict.items())
            if name.startswith("ray.") and isinstance(logger, logging.Logger) and logger.handlers
        ]
        for logger in loggers:
            for handler in list(logger.handlers):
                if _to_terminal(handler):
                    logger.removeHandler(handler)
                    self._replaced.append((logger, handler))
            if self._handler not in logger.handlers and (logger.name == "ray" or not logger.propagate):
                logger.addHandler(self._handler)

    def open(self, path: Path) -> None:
        """Write to ``path`` from now on (appending: a resumed study's drivers share it), and say so."""
        with self._lock:
            if self._file is not None:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = runtime_dir.open_private(path, "a")  # never through a link; closed in close()
            self.path = path
            self._file.write(f"--- driver started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            for line in self._pending:
                self._file.write(line + "\n")
            self._pending.clear()
        print(f"Ray's and Tune's logs: {path} (--verbose shows them here)", flush=True)

    def write(self, line: str) -> None:
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")
            elif len(self._pending) < 100_000:
                self._pending.append(line)

    def worker_output(self, data: dict[str, Any]) -> None:
        """A batch of a Ray worker's output (Ray's stream dispatcher): to the file; the platform's own
        lines to the terminal too. The autoscaler's status reports only as far as Ray would print them."""
        lines = data.get("lines", [])
        if data.get("pid") == "autoscaler":
            from clsr.study.run.tune_compat import autoscaler_events

            lines = autoscaler_events(lines)
        who = data.get("actor_name") or data.get("task_name") or ""
        prefix = f"({who} pid={data.get('pid')})" if data.get("pid") not in ("raylet", "autoscaler") else ""
        prefix = prefix or f"({data.get('pid')})"
        for line in lines:
            self.write(f"{prefix} {line}")
            if PLATFORM_LINES.search(line):
                self._echo(line)

    def ray_message(self, data: dict[str, Any], ignore_prefix: bool = False) -> None:
        """A message Ray pushes to the driver (a worker killed for memory, a warning of the raylet's):
        to the file, and its first line to the terminal unless it is one of Ray's known warnings."""
        for message in data.get("lines", []):
            self.write(f"({data.get('pid', 'ray')}) {message}")
            first = message.strip().splitlines()[0] if message.strip() else ""
            if first and not RAY_NOISE.search(first):
                self._echo(f"ray: {first[:300]} (details in {self.path or 'the driver log'})")

    def route_workers(self) -> bool:
        """After ``ray.init(log_to_driver=True)``: the workers' output to this log instead of the
        terminal. False when this Ray has no such dispatcher (its output then stays on the terminal)."""
        from clsr.study.run.tune_compat import route_ray_messages, route_worker_output

        if not route_worker_output(self.worker_output):
            return False
        route_ray_messages(self.ray_message)  # the driver's listener of Ray's error messages
        return True

    def error(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(REPORTED_ELSEWHERE):
            return
        first = message.strip().splitlines()[0] if message.strip() else record.levelname
        where = self.path or "the log that follows"
        self._echo(f"ray: {first[:300]} (details in {where})")

    def close(self) -> None:
        """Put Ray's loggers back; write what never reached a file to stderr."""
        for logger, handler in self._replaced:
            logger.addHandler(handler)
        for logger in [logging.getLogger("ray")] + [h[0] for h in self._replaced]:
            logger.removeHandler(self._handler)
        self._replaced.clear()
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
            elif self._pending:
                sys.stderr.write("\n".join(self._pending) + "\n")
                self._pending.clear()


class _Records(logging.Handler):
    def __init__(self, log: DriverLog) -> None:
        super().__init__(logging.DEBUG)
        self.log = log
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.log.write(self.format(record))
            if record.levelno >= logging.ERROR:
                self.log.error(record)
        except Exception:  # a log record must never stop the study
            self.handleError(record)


def _to_terminal(handler: logging.Handler) -> bool:
    if type(handler).__name__ == "PlainRayHandler":
        return True
    stream = getattr(handler, "stream", None)
    return not isinstance(handler, logging.FileHandler) and stream in (sys.stderr, sys.stdout)


# --- the progress table ---


def trial_label(point: dict[str, Any], trial_id: str | None = None) -> str:
    """``ablation[point]`` as the study's trial keys name it; a sampled trial by its sampled values."""
    label = point.get("label")
    if not label:
        overrides = point.get("overrides") or {}
        label = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in overrides.items()
        )
        label = label or (f"sample {trial_id}" if trial_id else "base")
    also = len(point.get("also") or [])
    return f"{point.get('ablation')}[{label}]" + (f" (+{also} identical)" if also else "")


def shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its start and end kept, the middle cut at an ellipsis."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    tail = (width - 1) // 2
    return text[: width - 1 - tail] + ELLIPSIS + (text[-tail:] if tail else "")


def trial_status(status: str, result: dict[str, Any]) -> str:
    """Tune's trial status in the platform's words: a TERMINATED trial that did not report its end
    ended early (stopped by the scheduler or a time limit, or failed without an exception)."""
    if status == "TERMINATED":  # or failed for good without an exception (a NaN loss): the summary says
        return "finished" if result.get("finished") else "ended early"
    return {"ERROR": "error"}.get(status, status.lower())


def format_steps(step: Any, total: int | None) -> str:
    step_text = str(int(step)) if isinstance(step, (int, float)) else "-"
    return f"{step_text}/{total}" if total else step_text


def format_score(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def progress_table(rows: list[dict[str, Any]], metric: str, width: int | None = None) -> list[str]:
    """Rows (label, seed, step, total, score, status) as aligned lines; a header first."""
    width = width or shutil.get_terminal_size((100, 24)).columns
    cells = [
        (
            r["label"],
            str(r["seed"]),
            format_steps(r.get("step"), r.get("total")),
            format_score(r.get("score")),
            r["status"],
        )
        for r in rows
    ]
    header = ("point", "seed", "step", metric, "status")
    fixed = [
        max(len(header[i]), *(len(c[i]) for c in cells)) if cells else len(header[i]) for i in range(1, 5)
    ]
    room = width - 2 - sum(fixed) - 2 * 4
    label_width = max(LABEL_WIDTH[0], min(LABEL_WIDTH[1], room))
    label_width = min(label_width, max([len(header[0])] + [len(c[0]) for c in cells]))
    lines = []
    for row in [header, *cells]:
        label = shorten(row[0], label_width).ljust(label_width)
        seed, step, score = (row[i].rjust(fixed[i - 1]) for i in (1, 2, 3))
        lines.append(f"  {label}  {seed}  {step}  {score}  {row[4]}".rstrip())
    return lines


def counts(statuses: list[str]) -> str:
    order = ["running", "pending", "paused", "finished", "ended early", "error"]
    seen = {s: statuses.count(s) for s in dict.fromkeys(statuses)}
    return ", ".join(
        f"{seen[s]} {s}" for s in sorted(seen, key=lambda s: order.index(s) if s in order else 99)
    )


def error_line(label: str, seed: Any, error_file: str | None, retrying: bool = False) -> str:
    """One line for a failed trial: its error (the traceback's last line) and where the traceback is."""
    last = ""
    if error_file:
        try:
            lines = [ln for ln in Path(error_file).read_text(errors="replace").splitlines() if ln.strip()]
            last = lines[-1].strip() if lines else ""
        except OSError:
            pass
    what = "failed, retrying from its last checkpoint" if retrying else "failed"
    said = f": {shorten(last, 200)}" if last else ""
    where = f"; full traceback: {error_file}" if error_file else ""
    return f"trial {label} seed {seed} {what}{said}{where}"


def stored_copy(error_file: str | None, trial_path: str | None) -> str | None:
    """Where Tune keeps a trial's error file in the study's storage (the trial's folder there), when
    that is a local folder; None otherwise."""
    if not error_file or not trial_path or "://" in trial_path:
        return None
    return str(Path(trial_path) / Path(error_file).name)


class Progress(TrialProgressCallback):
    """Tune callback: a compact table of the experiment's trials when they change, at most every
    ``every_s`` seconds (and once at the end), and one line for each trial that fails. It takes the
    place of Tune's own ``TrialProgressCallback``, which Tune adds unless one is given (and which
    prints a line per completed trial at any verbosity)."""

    def __init__(
        self,
        experiment: str,
        metric: str,
        max_steps: dict[str, int | None] | None = None,
        every_s: float = TABLE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        out: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(metric=metric)
        self.experiment = experiment
        self.metric = metric
        self.max_steps = dict(max_steps or {})
        self.every_s = every_s
        self.clock = clock
        self.out = out
        self._last_print: float | None = None
        self._shown: list[tuple] | None = None
        self._changed = False

    def __getstate__(self) -> dict[str, Any]:  # pickled in Tune's experiment state: settings only
        state = self.__dict__.copy()
        state.update(_last_print=None, _shown=None, _changed=False, out=None)
        return state

    def _say(self, line: str) -> None:
        if self.out is not None:
            self.out(line)
        else:
            print(line, flush=True)

    def total(self, point: dict[str, Any]) -> int | None:
        overrides = point.get("overrides") or {}
        if isinstance(overrides.get("trainer.max_steps"), (int, float)):
            return int(overrides["trainer.max_steps"])
        return self.max_steps.get(point.get("ablation"))

    def rows(self, trials: list[Any]) -> list[dict[str, Any]]:
        rows = []
        for trial in trials:
            point = (trial.config or {}).get("point")
            if not isinstance(point, dict):
                continue
            result = trial.last_result or {}
            rows.append(
                {
                    "label": trial_label(point, trial.trial_id),
                    "seed": point.get("seed"),
                    "step": result.get("step"),
                    "total": self.total(point),
                    "score": result.get(self.metric),
                    "status": trial_status(trial.status, result),
                }
            )
        return rows

    def table(self, trials: list[Any], width: int | None = None) -> list[str]:
        rows = self.rows(trials)
        title = f"[{time.strftime('%H:%M:%S')}] {self.experiment}: {counts([r['status'] for r in rows])}"
        shown = sorted(
            rows, key=lambda r: SHOWN_FIRST.index(r["status"]) if r["status"] in SHOWN_FIRST else 9
        )
        more = len(rows) - MAX_ROWS
        lines = progress_table(shown[:MAX_ROWS] if more > 0 else rows, self.metric, width)
        return [title, *lines] + ([f"  {ELLIPSIS} and {more} more trial(s)"] if more > 0 else [])

    def _maybe_print(self, trials: list[Any], force: bool = False) -> None:
        now = self.clock()  # Tune ends a step many times a second: the rows only when a table may come
        if not force and self._last_print is not None and now - self._last_print < self.every_s:
            return
        rows = self.rows(trials)
        state = [tuple(sorted(r.items(), key=lambda kv: kv[0])) for r in rows]
        if state == self._shown or not state or all(r["status"] == "pending" for r in rows):
            return
        for line in self.table(trials):
            self._say(line)
        self._shown, self._last_print = state, now

    def on_step_end(self, iteration: int, trials: list[Any], **info) -> None:
        self._maybe_print(trials)

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict, **info) -> None:
        pass  # shown in the next table

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info) -> None:
        pass  # shown in the next table

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info) -> None:
        self._say(self._error(trial, retrying=False))

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info) -> None:
        self._say(self._error(trial, retrying=True))

    def _error(self, trial: Any, retrying: bool) -> str:
        point = (trial.config or {}).get("point") or {}
        try:
            error_file = trial.error_file  # in Ray's session folder: Tune copies it to the storage
        except Exception:  # a trial without its folder yet
            error_file = None
        line = error_line(trial_label(point, trial.trial_id), point.get("seed"), error_file, retrying)
        kept = stored_copy(error_file, getattr(trial, "path", None))
        return line.replace(f"full traceback: {error_file}", f"full traceback: {kept}") if kept else line

    def on_experiment_end(self, trials: list[Any], **info) -> None:
        self._maybe_print(trials, force=True)
