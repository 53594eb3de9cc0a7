"""When a file's log checks run (logfollow.py does the checking): on the machine's LogCheck
effect, and from the sweep while they are behind or unsaved; never while the file catches up
(the checks would compete with the fetch for the GIL, and a copy that is behind is not ready
anyway)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from syncd.core.logreport import Report
from syncd.daemon.logfollow import IncrementalVerifier
from syncd.disk import logfile


class Checked(Protocol):
    """The file's machine, as its log checks see it (core/filemachine/)."""

    @property
    def held(self) -> int:
        """Bytes of the file the machine holds as its copy: what the checks catch up to."""

    @property
    def fetch(self) -> object | None:
        """The fetch under way, if any (the checks wait for it to end)."""

    @property
    def note(self) -> object | None:
        """An append noted as under way at start (its bytes are not known good yet)."""


class LogChecks:
    def __init__(self, where: logfile.Where, state_file: Path, records: str,
                 machine: Checked) -> None:
        self.verifier = IncrementalVerifier(where, state_file, records)
        self._machine = machine
        self._restored = False  # the saved state was looked at (or thrown away)
        self._open = True  # the checks may be behind or unsaved (see sweep)

    def on_log_check(self, restart: bool) -> None:
        """The machine's LogCheck effect: `restart`, the file's history was replaced."""
        if restart:
            self.verifier.restart()
            self._restored = True
        elif not self._restored:
            self._restored = True
            if self._machine.note is None:
                self.verifier.restore(self._machine.held)
        self.follow()

    def follow(self) -> None:
        self._open = True  # the sweep looks at it until it has caught up and is saved
        m = self._machine
        if m.fetch is None:
            self.verifier.follow(lambda: m.held, lambda: m.fetch is not None)

    def sweep(self) -> None:
        """Resume the checks if they are behind, and save them: nothing more once they have
        caught up and are saved, until the next LogCheck (thousands of idle files)."""
        if self._open:
            verifier = self.verifier
            if verifier.unsaved or verifier.size < self._machine.held:
                self.follow()
                verifier.save()
            else:
                self._open = False

    async def close(self) -> None:
        await self.verifier.close()

    # --- what readiness and status read -----------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes of the file the checks cover."""
        return self.verifier.size

    @property
    def caught_up_at(self) -> float | None:
        return self.verifier.caught_up_at

    def report(self) -> Report | None:
        return self.verifier.report()

    def references(self) -> dict[str, tuple[int, int]]:
        """The resource references the log holds, each with where it first appears."""
        return self.verifier.checker.references()

    def status(self, report: Report | None) -> dict[str, object]:
        """Status `log_check`."""
        v = self.verifier
        return {"bytes": v.size, "read": v.bytes_read,
                "clean": report.clean if report else None,
                "problems": dict(report.problem_counts) if report else {}}
