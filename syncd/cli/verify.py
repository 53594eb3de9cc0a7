"""`syncd verify PATH|KEY`: the seed's checks over events.jsonl files, for an operator to read.

Exit status: 0 every file is clean, 1 problems found, 2 the arguments cannot be used. What the
seed allows (late narrative projections, the turn in progress at the tail) is printed as a
note and does not make a file unclean: see syncd/core/logcheck.py's header for each rule,
and docs/event-logs.md.
"""

from __future__ import annotations

import os
import stat as stat_mode
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NoReturn

import click
import orjson

from syncd.cli.common import DEFAULT_CONFIG, KeyCommand, key_config_option
from syncd.config import ConfigError, load_config
from syncd.core.errors import SyncdError
from syncd.core.framecheck import Checker, checker_for
from syncd.core.logcheck import with_problems
from syncd.core.logreport import Problem, ProblemKind, Report
from syncd.core.recordkinds import kind_for
from syncd.core.refs import required
from syncd.core.roots import KeyPathError
from syncd.core.safe_text import safe, safe_json
from syncd.disk import logfile

# Big enough that the per-call overhead vanishes, small enough to keep memory flat.
CHUNK_SIZE = 1 << 20

INSTANCE_LOG = "events.jsonl"  # an instance's log: its resources/ lie beside it

EXIT_CLEAN = 0
EXIT_PROBLEMS = 1
EXIT_UNUSABLE = 2


class UnusableTarget(SyncdError):
    """The argument names no file we can read; the message is the whole explanation."""


def resolve_files(target: str, config_path: Path | None) -> list[Path]:
    """The files behind PATH|KEY: an existing path is a file, anything else an instance key."""
    path = Path(target)
    if path.is_dir():
        path = path / "events.jsonl"  # an instance directory: its memory file
        if not path.is_file():
            raise UnusableTarget(f"{target} is a directory without an events.jsonl")
        return [path]
    if path.exists():
        return [path]
    if config_path is None or (config_path == DEFAULT_CONFIG and not config_path.exists()):
        raise UnusableTarget(
            f"{target}: no such file (to name an instance key, pass --config FILE)"
        )
    try:
        config = load_config(config_path)
    except ConfigError as error:
        raise UnusableTarget(str(error)) from None
    try:
        files = config.key_files(target)  # the key's directory, through Config.key_dir
    except KeyPathError as error:
        raise UnusableTarget(f"{target}: neither a file nor a valid instance key: "
                             f"{error.reason}") from None
    if not files:
        raise UnusableTarget(
            f"{target}: neither a file nor an instance key with files under "
            f"{config.roots.describe()}"
        )
    return files


def read_chunks(path: Path) -> Iterator[bytes]:
    """The file's bytes; a symbolic link or anything but a regular file is refused (OSError
    saying so): a log replaced by a link to a secret is not printed line by line."""
    fd = logfile.open_file(path, key_dir=False)
    with os.fdopen(fd, "rb") as file:
        while chunk := file.read(CHUNK_SIZE):
            yield chunk


def check_file(path: Path, records: str | None = None) -> Report:
    """`records`: lines or zstd frames; by default from the file's name (`*.zstd`: frames)."""
    checker = checker_for(records or kind_for(path.name))
    for chunk in read_chunks(path):
        checker.feed(chunk)
    if path.name != INSTANCE_LOG:
        return checker.report()  # a loose copy: no resources/ of its own to look at
    return missing_resources(path.parent / "resources", checker)


def missing_resources(folder: Path, checker: Checker) -> Report:
    """The checker's report, with every line whose referenced resource files are not in
    `folder` (the instance's resources/). Artifacts are written before the line that names
    them, so a missing one is damage; an asset's files that are not there are a note (the
    writer fetches media when first used; readiness treats them alike)."""
    problems: list[Problem] = []
    unfetched = 0
    for ref, (line, offset) in checker.references().items():
        for name in required(ref):
            try:
                present = stat_mode.S_ISREG(os.lstat(folder / name).st_mode)
            except OSError:
                present = False
            if present:
                continue
            if ref.startswith("asset://"):
                unfetched += 1
                continue
            problems.append(Problem(ProblemKind.MISSING_RESOURCE, line, offset,
                                    f"references {ref}, but resources/{name} is missing",
                                    reference=ref))
    notes = [f"{unfetched} file(s) of referenced assets not in resources/assets (not fetched "
             "here)"] if unfetched else []
    return with_problems(checker.report(), problems, notes)


def fail(command: str, message: str) -> NoReturn:
    """Say why in one line on stderr, and stop with the "unusable arguments" status."""
    click.echo(f"syncd {command}: {safe(message)}", err=True)
    raise click.exceptions.Exit(EXIT_UNUSABLE)


def describe_os_error(error: OSError) -> str:
    return error.strerror or str(error)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _describe_problem(problem: Problem) -> str:
    text = problem.message
    if problem.detail is not None:
        text = f"{text}: {problem.detail}"
    return f"  line {problem.line} (byte {problem.offset}): {safe(text)}"


def _counts_table(title: str, counts: Mapping[str, int]) -> list[str]:
    if not counts:
        return [f"{title}: none"]
    # The layout of `sort | uniq -c`, so that it reads like the seed's recipe.
    return [f"{title}:", *(f"{count:>7} {safe(name)}" for name, count in counts.items())]


def render_report(label: str, report: Report) -> str:
    size = [_plural(report.lines, "line")]
    if report.blank_lines:
        size.append(f"{report.blank_lines} blank")
    size.append(_plural(report.bytes_checked, "byte"))
    verdict = "clean" if report.clean else _plural(report.problem_total, "problem")
    lines = [f"{safe(label)}: {verdict} ({', '.join(size)})"]
    lines.extend(_describe_problem(problem) for problem in report.problems)
    if report.unlisted:
        lines.append(f"  ... and {report.unlisted} more not listed")
    lines.extend(f"  note: {safe(note)}" for note in report.notes)
    events = report.turn_events
    ended = events["turn.done"] + events["turn.failed"] + events["turn.aborted"]
    if report.dsh is not None:  # a dsh-session file (core/dshcheck.py)
        d = report.dsh
        lines.append(f"dsh session: {d['events']} events; turns: {d['turns_started']} started, "
                     f"{d['turns_ended']} ended; steps: {d['steps']}; tool calls: "
                     f"{d['tool_calls']}, tool results: {d['tool_results']}")
    else:
        lines.append(
            f"turns: {events['turn.start']} started, {ended} ended "
            f"({events['turn.done']} done, {events['turn.failed']} failed, "
            f"{events['turn.aborted']} aborted)"
        )
    lines.extend(_counts_table("entries by type", report.entry_types))
    lines.extend(_counts_table("messages by role or custom type", report.message_types))
    return "\n".join(lines)


@click.command("verify", cls=KeyCommand)
@click.argument("target", metavar="PATH|KEY")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@key_config_option
def command(target: str, as_json: bool, config_path: Path | None) -> None:
    """Check events.jsonl files: bad lines, torn tail, unfinished turns, lost tool results,
    missing compaction anchors; then count entries by type.

    Exits 0 when clean, 1 when problems were found, 2 when the arguments are unusable.
    """
    try:
        files = resolve_files(target, config_path)
    except UnusableTarget as error:
        fail("verify", str(error))

    reports: list[tuple[Path, Report]] = []
    for path in files:
        try:
            reports.append((path, check_file(path)))
        except OSError as error:
            fail("verify", f"cannot read {path}: {describe_os_error(error)}")

    clean = all(report.clean for _, report in reports)
    if as_json:
        document = {
            "clean": clean,
            "files": [{"path": str(path), **report.to_json()} for path, report in reports],
        }
        click.echo(safe_json(orjson.dumps(document).decode()))
    else:
        click.echo("\n\n".join(render_report(str(path), report) for path, report in reports))
    if not clean:
        raise click.exceptions.Exit(EXIT_PROBLEMS)
