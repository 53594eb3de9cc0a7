"""`syncd inspect PATH|KEY --turn TURN_ID`: one turn's timeline, like the seed's jq recipe

    jq -c 'select(.turnId=="…") | {timestamp, type, detail: (.data.type // .data.role)}'

with the time in ISO-8601 UTC and a short detail a person can read. A dsh-session file
(core/dshcheck.py) is told by its first entry: TURN_ID is then the turn's number, its entries
those whose `data.turn` is that number, and a `session.jsonl.zstd` is read decompressed (its
line numbers count the decompressed stream, as `syncd verify` does).
Exit status: 0 turn shown, 1 turn not found, 2 the arguments cannot be used.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import orjson

from syncd.cli.common import KeyCommand, key_config_option
from syncd.cli.verify import (
    EXIT_PROBLEMS,
    UnusableTarget,
    describe_os_error,
    fail,
    read_chunks,
    resolve_files,
)
from syncd.core.dshcheck import CHUNK_ROWS, looks_dsh
from syncd.core.logcheck import (
    COMPACT_TYPES,
    TOOL_CALL_PART_TYPES,
    TOOL_RESULT_PART_TYPES,
    TURN_TERMINALS,
)
from syncd.core.recordkinds import ZSTD_FRAMES, kind_for
from syncd.core.safe_text import safe, safe_json

try:
    from compression import zstd as _zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from backports import zstd as _zstd  # type: ignore[no-redef,unused-ignore]

OUT_STEP = 1 << 20  # decompressed a MiB at a time

SNIPPET_CHARS = 60

# An id made of these characters appears verbatim in every line that carries it (JSON never
# needs to escape them), so lines without its bytes can be skipped unparsed.
_VERBATIM_ID = re.compile(r"[A-Za-z0-9_.:-]+")


@dataclass(frozen=True)
class TimelineRow:
    line: int
    offset: int
    timestamp: Any  # as written: normally epoch milliseconds
    entry_type: str
    detail: str

    @property
    def time(self) -> str:
        return iso_time(self.timestamp)

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "offset": self.offset,
            "timestamp": self.timestamp,
            "time": self.time,
            "type": self.entry_type,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Timeline:
    path: Path
    rows: tuple[TimelineRow, ...]
    unreadable_lines: tuple[int, ...]  # lines that mention the turn but are not valid JSON
    ended_by: str | None  # the first terminal event of the turn

    @property
    def status(self) -> str:
        return "not ended" if self.ended_by is None else f"ended by {self.ended_by}"


def iso_time(timestamp: Any) -> str:
    if type(timestamp) is not int:
        return "-"
    try:
        moment = datetime.fromtimestamp(timestamp // 1000, UTC)
    except (OverflowError, ValueError, OSError):
        return "-"
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{timestamp % 1000:03d}Z"


def snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1] + "…"


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text" and "text" in part
        )
    return ""


def _part_type(part: dict[str, Any]) -> str:
    part_type = part.get("type")
    return part_type if isinstance(part_type, str) else ""


def _call_label(part: dict[str, Any]) -> str:
    name = part.get("toolName", part.get("name", "?"))
    call_id = part.get("toolCallId", part.get("id", "?"))
    return f"{_text(name)}({_text(call_id)})"


def _describe_message(message: dict[str, Any]) -> str:
    role = message.get("role")
    content = message.get("content")
    parts = [p for p in content if isinstance(p, dict)] if isinstance(content, list) else []
    if role == "custom":
        custom_type = _text(message.get("type"))
        inner = message.get("data")
        if isinstance(inner, dict) and isinstance(inner.get("content"), str):
            user = inner.get("user")
            who = ""
            if isinstance(user, dict):
                who = f"{_text(user.get('name', user.get('id', '')))}: "
            return f"{custom_type}: {snippet(who + inner['content'])}"
        return custom_type
    if role == "assistant":
        text = snippet(_content_text(content))
        calls = [_call_label(p) for p in parts if _part_type(p) in TOOL_CALL_PART_TYPES]
        detail = f"assistant: {text}" if text else "assistant"
        return f"{detail} -> {', '.join(calls)}" if calls else detail
    if role == "tool":
        results = []
        for part in parts:
            if _part_type(part) not in TOOL_RESULT_PART_TYPES:
                continue
            output = part.get("output")
            # AI SDK outputs are {"type": "text" | "json" | ..., "value": ...}
            value = output.get("value") if isinstance(output, dict) else output
            shown = snippet(_text(value)) if value is not None else ""
            results.append(f"{_call_label(part)}: {shown}" if shown else _call_label(part))
        return f"tool: {'; '.join(results)}" if results else "tool"
    text = snippet(_content_text(content))
    return f"{_text(role)}: {text}" if text else _text(role)


def describe_entry(entry: dict[str, Any]) -> str:
    entry_type = entry.get("type")
    data = entry.get("data")
    if not isinstance(data, dict):
        return ""
    if entry_type == "message":
        return _describe_message(data)
    if entry_type == "event":
        event_type = _text(data.get("type"))
        error = data.get("error")
        reason = error.get("message") if isinstance(error, dict) else data.get("reason")
        return f"{event_type}: {snippet(_text(reason))}" if reason is not None else event_type
    if isinstance(entry_type, str) and entry_type in COMPACT_TYPES:
        return f"lastEntryId {_text(data.get('lastEntryId'))}"
    if entry_type == "ishiki.images":
        shown, released = data.get("shown"), data.get("released")
        if isinstance(shown, list) and isinstance(released, list):
            return f"shown {len(shown)}, released {len(released)}"
    return ""


def _decompressed(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The content of a file of Zstandard frames, a MiB at a time (ZstdError if damaged)."""
    d = _zstd.ZstdDecompressor()
    for chunk in chunks:
        data = chunk
        while True:
            out = d.decompress(data, OUT_STEP)
            data = b""
            if out:
                yield out
            if d.eof:  # the next frame starts in what is left
                data, d = d.unused_data, _zstd.ZstdDecompressor()
                if not data:
                    break
            elif d.needs_input:
                break


def _lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(number, offset, bytes) of every line, the torn tail included."""
    number, offset, pending = 0, 0, bytearray()
    chunks = read_chunks(path)
    if kind_for(path.name) == ZSTD_FRAMES:
        chunks = _decompressed(chunks)
    for chunk in chunks:
        if b"\n" not in chunk:
            pending += chunk  # a long line: grow it without copying what we hold
            continue
        pieces = chunk.split(b"\n")
        pieces[0] = bytes(pending) + pieces[0]
        pending = bytearray(pieces.pop())
        for piece in pieces:
            number += 1
            yield number, offset, piece
            offset += len(piece) + 1
    if pending:
        yield number + 1, offset, bytes(pending)


def turn_timeline(path: Path, turn_id: str) -> Timeline:
    needle = turn_id.encode() if _VERBATIM_ID.fullmatch(turn_id) else b""
    rows: list[TimelineRow] = []
    unreadable: list[int] = []
    ended_by: str | None = None
    dsh: bool | None = None  # told by the first entry
    for number, offset, raw in _lines(path):
        if dsh is None:
            try:
                first = orjson.loads(raw)
            except orjson.JSONDecodeError:
                first = None
            dsh = isinstance(first, dict) and looks_dsh(first)
            if dsh:
                return _dsh_timeline(path, turn_id)
        if needle not in raw:
            continue
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            if needle:
                unreadable.append(number)
            continue
        if not isinstance(entry, dict):
            continue
        owner = entry.get("turnId")
        data = entry.get("data")
        if owner is None and entry.get("type") == "event" and isinstance(data, dict):
            owner = data.get("turnId")
        if owner != turn_id:
            continue
        if ended_by is None and entry.get("type") == "event" and isinstance(data, dict):
            event_type = data.get("type")
            if event_type in TURN_TERMINALS:
                ended_by = event_type
        rows.append(
            TimelineRow(
                line=number,
                offset=offset,
                timestamp=entry.get("timestamp"),
                entry_type=_text(entry.get("type")),
                detail=describe_entry(entry),
            )
        )
    return Timeline(path, tuple(rows), tuple(unreadable), ended_by)


def _dsh_detail(kind: str, data: dict[str, Any]) -> str:
    if kind in ("step/start", "step/end"):
        return f"step {_text(data.get('step'))}"
    if kind == "tool/call":
        return f"{_text(data.get('name', '?'))}({_text(data.get('callId', '?'))})"
    inner = data.get("message")
    message: dict[str, Any] = inner if isinstance(inner, dict) else data
    if kind == "tool/result":
        source = message.get("source")
        call = source.get("callId") if isinstance(source, dict) else None
        error = data.get("error")
        code = f" {_text(error.get('code'))}" if isinstance(error, dict) else ""
        return f"result of {_text(call)}{code}"
    if kind == "turn/end":
        reason = data.get("reason")
        return _text(reason.get("kind")) if isinstance(reason, dict) else ""
    if kind in CHUNK_ROWS:
        texts = data.get("texts", data.get("args"))
        return f"{len(texts)} chunks" if isinstance(texts, list) else ""
    if kind == "assistant/chunk":
        chunk = data.get("chunk")
        return _text(chunk.get("type")) if isinstance(chunk, dict) else ""
    return snippet(_content_text(message.get("content")))


def _dsh_timeline(path: Path, turn_id: str) -> Timeline:
    """A dsh session's turn, by number: every record whose data names it."""
    rows: list[TimelineRow] = []
    unreadable: list[int] = []
    ended_by: str | None = None
    turn = int(turn_id) if turn_id.isdigit() else None
    for number, offset, raw in _lines(path):
        if turn is None or b'"turn"' not in raw:
            continue
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            unreadable.append(number)
            continue
        data = entry.get("data") if isinstance(entry, dict) else None
        if not isinstance(data, dict) or data.get("turn") != turn:
            continue
        kind = _text(entry.get("type"))
        if kind == "turn/end" and ended_by is None:
            reason = _dsh_detail(kind, data)
            ended_by = f"turn/end ({reason})" if reason else kind
        rows.append(TimelineRow(line=number, offset=offset,
                                timestamp=entry.get("time", entry.get("time0")),
                                entry_type=kind, detail=_dsh_detail(kind, data)))
    return Timeline(path, tuple(rows), tuple(unreadable), ended_by)


def render_timeline(label: str, turn_id: str, timeline: Timeline) -> str:
    rows = timeline.rows
    span = f"line {rows[0].line}" if len(rows) == 1 else f"lines {rows[0].line}-{rows[-1].line}"
    count = "1 entry" if len(rows) == 1 else f"{len(rows)} entries"
    out = [safe(f"turn {turn_id} in {label}: {count}, {span}, {timeline.status}")]
    number_width = len(str(rows[-1].line))
    types = [safe(row.entry_type) for row in rows]  # the log's text: another host's, maybe
    type_width = max(len(t) for t in types)
    for row, entry_type in zip(rows, types, strict=True):
        line = f"  {row.line:>{number_width}}  {row.time:<24}  {entry_type:<{type_width}}"
        out.append(f"{line}  {safe(row.detail)}".rstrip())
    return "\n".join(out)


@click.command("inspect", cls=KeyCommand)
@click.argument("target", metavar="PATH|KEY")
@click.option("--turn", "turn_id", required=True, metavar="TURN_ID",
              help="The turnId to show (in a dsh-session file: the turn's number).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@key_config_option
def command(target: str, turn_id: str, as_json: bool, config_path: Path | None) -> None:
    """Show one turn's timeline: line, time (UTC), entry type and a short detail.

    Exits 0 when the turn was found, 1 when it was not, 2 when the arguments are unusable.
    """
    try:
        files = resolve_files(target, config_path)
    except UnusableTarget as error:
        fail("inspect", str(error))

    found: list[Timeline] = []
    for path in files:
        try:
            timeline = turn_timeline(path, turn_id)
        except OSError as error:
            fail("inspect", f"cannot read {path}: {describe_os_error(error)}")
        except _zstd.ZstdError as error:
            fail("inspect", f"{path}: a frame does not decompress ({error}); see syncd verify")
        for number in timeline.unreadable_lines:
            click.echo(
                f"syncd inspect: {safe(path)}: line {number} mentions the turn but is not valid "
                "JSON (see syncd verify)",
                err=True,
            )
        if timeline.rows:
            found.append(timeline)

    if not found:
        where = ", ".join(str(path) for path in files)
        click.echo(safe(f"syncd inspect: turn {turn_id} not found in {where}"), err=True)
        raise click.exceptions.Exit(EXIT_PROBLEMS)
    if as_json:
        document = {
            "turnId": turn_id,
            "files": [
                {
                    "path": str(timeline.path),
                    "status": timeline.status,
                    "entries": [row.to_json() for row in timeline.rows],
                }
                for timeline in found
            ],
        }
        click.echo(safe_json(orjson.dumps(document).decode()))
    else:
        click.echo("\n\n".join(render_timeline(str(t.path), turn_id, t) for t in found))
