"""What one study command's driver holds for its terminal, passed down from the command."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clsr.study.control.driver_link import NO_LINK, DriverLink

if TYPE_CHECKING:
    from clsr.study.control.notify import Notifier


@dataclass
class Console:
    """What one study command's driver holds for its terminal, passed down from the command (a
    ``platform study resume --or-run`` runs the study twice with one Console): ``quiet``, without
    --verbose where Ray's and Tune's output goes instead (a ``clsr.study.run.progress.DriverLog``);
    ``noted``, the notes already said; ``link``, the supervisor's (``DriverLink``); ``notifier``, the
    study's webhook while its waves run (``clsr.study.control.notify``; never sent to Ray). Two studies
    run in one process with their own Consoles share none of it."""

    link: DriverLink = NO_LINK
    quiet: Any = None
    noted: set[str] = field(default_factory=set)
    notifier: Notifier | None = None

    def note_once(self, line: str) -> None:
        if line not in self.noted:
            self.noted.add(line)
            print(line)
