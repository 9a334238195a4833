"""Ctrl-C, SIGTERM and the study's time limit: stop the trials, keep their checkpoints, record the truth.

Ray Tune handles a first SIGINT by stopping the trials, saving the experiment state with the running
trials still unfinished (so ``Tuner.restore`` continues them) and *returning normally*, and it never
handles SIGTERM; nothing would tell the study driver that the study did not finish. So the driver
takes both signals itself (``TUNE_DISABLE_SIGINT_HANDLER=1``), remembers which one came, and asks
Tune to stop the same graceful way through the SIGUSR1 handler Tune installs for every run. Later
signals only say that the record is being written: a second Ctrl-C never leaves a half-written record.
A signal that reaches the driver twice at once (from its process group, and passed on by the
supervisor in ``clsr.study.run.supervise``) counts once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from clsr.study.control.driver_link import LEASE_LOST_EXIT, NO_LINK, DriverLink

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
TIMED_OUT_EXIT = 124  # as timeout(1)


class Interrupted(KeyboardInterrupt):
    """Raised in the driver when a signal comes while no Tune experiment is running."""


class Interrupts:
    """While active: SIGINT/SIGTERM (and ``study_timeout_s``) stop the study once, gracefully.

    A SIGTERM sent to the driver's whole process group (a batch scheduler, a preempted node) reaches
    the local Ray's own processes too, and the graceful stop can then hang on a Ray that is gone. So
    ``GRACE_S`` after the first signal, if the study has not closed its record by itself, a watchdog
    writes it (``on_give_up``: unfinished runs interrupted, the parent KILLED) and ends the process
    with the signal's exit code; schedulers send SIGKILL after 30 s.
    """

    GRACE_S = 20.0

    def __init__(self, study_timeout_s: float | None = None, link: DriverLink = NO_LINK):
        self.link = link  # the supervisor's: told why the driver stops and when the record is settled
        self.reason: str | None = None  # "SIGINT", "SIGTERM" or "study_timeout"
        self.exit_code = 0
        self.in_experiment = False  # a Tune fit is running: Tune stops it on SIGUSR1
        self.recording = False  # the final record is being written: never raise
        self.on_give_up: Callable[[], None] | None = None  # writes the record when the driver hangs
        self.closed = threading.Lock()  # held while the record is written; one writer only
        self.record_written = False
        self._previous: dict[int, object] = {}
        self._first: tuple[int, float] | None = None  # the stopping signal and when it came
        self._usr1_before: object = None  # SIGUSR1's handler as the running experiment began
        self._timer = threading.Timer(study_timeout_s, self._time_up) if study_timeout_s else None

    def __enter__(self) -> Interrupts:
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        self.install()
        if self._timer is not None:
            self._timer.daemon = True
            self._timer.start()
        return self

    def install(self) -> None:
        """Take SIGINT and SIGTERM (again after ``ray.init``, whose core worker installs a SIGTERM
        handler that aborts the process)."""
        if threading.current_thread() is threading.main_thread():
            for sig in EXIT_CODES:
                previous = signal.signal(sig, self._on_signal)
                self._previous.setdefault(sig, previous)

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def stopped(self) -> bool:
        return self.reason is not None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._first is not None and self._first[0] == signum and time.monotonic() - self._first[1] < 1.0:
            return  # the same signal from the process group and from the supervisor
        if self.stopped:
            print(
                f"\n{name} again: the study is already stopping; its record is being written", file=sys.stderr
            )
            return
        self._first = (signum, time.monotonic())
        self._stop(name, EXIT_CODES[signum])

    def lease_lost(self, why: str) -> None:
        """Another driver took the study over (this one was paused past the lease's stale limit): stop
        the trials like a signal would; the record is that driver's now (``record.close_study`` writes
        nothing)."""
        self._stop("lease_lost", LEASE_LOST_EXIT, from_thread=True)

    def stop_for(self, reason: str) -> None:
        """A stop the study asks of itself (its budget spent, ``platform study stop``), from the watch's
        thread, with exit status 0 (the study did what it was told): Tune is asked to stop as for a
        signal, but no watchdog ends the process (the driver is healthy: it closes its record and posts
        its notices itself). Nothing once the record is being written."""
        if self.recording or self.stopped:
            return
        self.reason, self.exit_code = reason, 0
        self.link.tell(stopping=reason)
        print(f"\n{reason}: stopping the study; the wave loop starts no further experiment", file=sys.stderr)
        self._ask_tune()

    def _time_up(self) -> None:
        print("\nstudy_timeout_s reached", file=sys.stderr)
        self._stop("study_timeout", TIMED_OUT_EXIT, from_thread=True)

    def _stop(self, reason: str, exit_code: int, from_thread: bool = False) -> None:
        self.reason, self.exit_code = reason, exit_code
        self.link.tell(stopping=reason)
        threading.Thread(target=self._give_up_later, name="clsr-grace", daemon=True).start()
        print(
            f"\n{reason}: stopping the study; running trials keep their last checkpoint "
            f"(a second Ctrl-C does not cut the record short)",
            file=sys.stderr,
        )
        if self.in_experiment:
            self._ask_tune()
        elif not self.recording and not from_thread:
            raise Interrupted(reason)

    def _ask_tune(self) -> None:
        """SIGUSR1 to the running fit (tune.py registers a handler for it as each fit starts, and never
        takes it back): sent only once this experiment's fit has installed its own handler, since
        before that the signal would reach the default action (the process killed) or an earlier
        fit's; until then a thread waits for it. Outside an experiment ``check`` stops the wave loop."""
        if self._fit_listening():
            os.kill(os.getpid(), signal.SIGUSR1)
        elif self.in_experiment:
            threading.Thread(target=self._ask_tune_later, name="clsr-ask-tune", daemon=True).start()

    def _fit_listening(self) -> bool:
        return self.in_experiment and signal.getsignal(signal.SIGUSR1) not in (
            self._usr1_before,
            signal.SIG_DFL,
            signal.SIG_IGN,
            None,
        )

    def _ask_tune_later(self) -> None:
        while self.in_experiment and not self._fit_listening():
            time.sleep(0.2)
        if self._fit_listening():
            os.kill(os.getpid(), signal.SIGUSR1)

    def _give_up_later(self) -> None:
        time.sleep(self.GRACE_S)
        with self.closed:
            hung = not self.record_written
            if hung and self.on_give_up is not None:
                print(
                    f"\nthe study did not stop within {self.GRACE_S:.0f} s; writing its record",
                    file=sys.stderr,
                )
                try:
                    self.on_give_up()
                    self.link.tell(settled=True)
                except Exception as err:  # MLflow unreachable too: the lease goes stale, resume closes it
                    print(f"could not write the record ({type(err).__name__}: {err})", file=sys.stderr)
        if not hung:
            time.sleep(self.GRACE_S)  # the driver wrote the record and is ending (Ray's shutdown may hang)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(self.exit_code)

    @contextlib.contextmanager
    def experiment(self) -> Iterator[None]:
        """Around a Tune experiment's ``fit``: a stop asked for now goes to Tune (SIGUSR1)."""
        self.check()
        self._usr1_before = signal.getsignal(signal.SIGUSR1)  # this fit's handler replaces it
        self.in_experiment = True
        try:
            yield
        finally:
            self.in_experiment = False

    def check(self) -> None:
        """Raise ``Interrupted`` if a stop was asked for (between experiments, from a timer)."""
        if self.stopped:
            raise Interrupted(self.reason)
