"""`syncd status`: what the running daemon sees, per key and file and per peer.

Exit status: 0 all good; 1 some file is frozen (diverged, reset) or stuck (paused: disk
full; error: unreadable); 2 the daemon could not be asked.
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
def command(config_path: Path, as_json: bool) -> None:
    """Show each replicated file's state as the running daemon sees it."""
    config = load_or_exit(config_path)
    try:
        status = query(config.state_dir / SOCKET_NAME, "status")["status"]
    except ControlError as e:
        click.echo(f"syncd: {e}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(orjson.dumps(status, option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(render(status))
    if any(f["state"] in PROBLEM_STATES for f in status["files"]):
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
    return "\n".join(lines)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))
