"""`syncd status`: what the running daemon sees, per key and file and per peer.

Exit status: 0 all good; 1 some file is frozen (diverged, reset) or stuck (paused: disk
full; error: unreadable), here or, as a peer announces it, on a peer (a writer's clear() leaves
every standby's copy in_sync, and only the writer's announcement tells); 2 the daemon could
not be asked.

`syncd status --ready KEY [KEY...]` is for failover scripts: exit 0 only when this host can
take over every named key now (every file of it READY), 1 otherwise, with the reasons; 2
when the daemon could not be asked. READY itself is decided in syncd/readiness.py (`decide`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click
import orjson

from syncd.cli.common import config_option, load_or_exit
from syncd.control import ControlError, query
from syncd.node import SOCKET_NAME

PROBLEM_STATES = {"diverged", "reset", "paused", "error"}


@click.command("status")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
@click.option("--ready", "ready_keys", is_flag=True,
              help="Exit 0 only if this host can take over every KEY now (1 otherwise), "
                   "printing the reasons.")
@click.argument("keys", nargs=-1, metavar="[KEY...]")
def command(config_path: Path, as_json: bool, ready_keys: bool, keys: tuple[str, ...]) -> None:
    """Show each replicated file's state as the running daemon sees it."""
    if keys and not ready_keys:
        raise click.UsageError("KEY arguments go with --ready")
    if ready_keys and not keys:
        raise click.UsageError("--ready needs at least one KEY")
    config = load_or_exit(config_path)
    try:
        status = query(config.state_dir / SOCKET_NAME, "status")["status"]
    except ControlError as e:
        click.echo(f"syncd: {e}", err=True)
        sys.exit(2)
    if ready_keys:
        ok, text = ready_report(status, keys)
        click.echo(text)
        sys.exit(0 if ok else 1)
    if as_json:
        click.echo(orjson.dumps(status, option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(render(status))
    if any(f["state"] in PROBLEM_STATES or any(p["frozen"] for p in f["peers"].values())
           for f in status["files"]):
        sys.exit(1)


def render(status: dict[str, Any]) -> str:
    peers = status["peers"]
    online = sorted(n for n, p in peers.items() if p["online"])
    offline = sorted(n for n, p in peers.items() if not p["online"])
    head = (f"node {status['node']}  broker {status['broker']} "
            f"({'connected' if status['connected'] else 'DISCONNECTED'})  "
            f"peers online: {', '.join(online) or '-'}")
    if offline:
        head += f"  offline: {', '.join(offline)}"
    rows = [("KEY", "FILE", "SIZE", "STATE", "READY", "PEERS")]
    for f in status["files"]:
        peer_text = ", ".join(
            f"{n}={p['size']} {p['frozen'] or p['state']}{'' if p['online'] else ' (offline)'}"
            for n, p in f["peers"].items()
        ) or "-"
        rows.append((f["key"], f["file"], str(f["size"]), f["state"],
                     "yes" if f["ready"] else "no", peer_text))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [head, ""]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True))
                     + "  " + r[5])
    for f in status["files"]:
        name = f"{f['key']}/{f['file']}"
        freeze = f.get("freeze")
        if freeze or f.get("diverged") or f.get("note"):
            lines.append("")
        if freeze:
            lines.append(f"{name}: {freeze['reason'].upper()} since {_when(freeze['since'])}: "
                         f"{freeze['detail']}")
        for peer, d in f.get("diverged", {}).items():
            lines.append(f"{name}: DIVERGED from {peer} since {_when(d['since'])}: {d['detail']}")
            if d.get("line") is not None:
                lines.append(f"    first difference at byte {d['offset']}, line {d['line']} "
                             "(same line number on both sides)")
                lines.append(f"    here ({status['node']}): {d['ours']}")
                lines.append(f"    {peer}: {d['theirs']}")
            else:
                lines.append("    first difference: not located yet (the peer must be online)")
        if f.get("note"):
            lines.append(f"{name}: note: {f['note']}")
        if freeze or f.get("diverged"):
            lines.append(f"    resolve on the host whose copy should lose: syncd adopt {f['key']} "
                         "--from <node that wins>")
        elif f.get("error") or f.get("paused"):
            lines.append(f"{name}: {f['state'].upper()}: {f.get('error') or f.get('paused')}")
        elif not f["ready"]:
            lines.append(f"{name}: not ready to take over: {'; '.join(f['not_ready'])}")
        for note in f.get("notes", []):
            if note != f.get("note"):  # a noticed edit is printed above already
                lines.append(f"{name}: {note}")
    ready = status.get("ready_count")
    if ready is not None:
        lines.extend(["", f"ready to take over: {ready['yes']} of {ready['yes'] + ready['no']} "
                          "files"])
    return "\n".join(lines)


def ready_report(status: dict[str, Any], keys: tuple[str, ...]) -> tuple[bool, str]:
    """Can this host take over every key in `keys` now? One line per key, and its reasons."""
    lines = []
    all_ready = True
    for key in keys:
        files = [f for f in status["files"] if f["key"] == key]
        if not files:
            all_ready = False
            lines.append(f"{key}: NOT READY: {status['node']} replicates no file of this key")
            continue
        ready = all(f["ready"] for f in files)
        all_ready = all_ready and ready
        lines.append(f"{key}: {'ready' if ready else 'NOT READY'}")
        for f in files:
            lines.extend(f"  {f['file']}: {reason}" for reason in f["not_ready"])
            lines.extend(f"  {f['file']}: note: {note}" for note in f.get("notes", []))
    return all_ready, "\n".join(lines)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))
