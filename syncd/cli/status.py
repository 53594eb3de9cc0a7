"""`syncd status`: what the running daemon sees, per key and file and per peer.

Presentation only: the daemon's status document (`--json`) is the source of every fact; this
module filters it (KEY..., --problems), sizes it for people (KiB, MiB; lag in bytes and
seconds) and adds a summary line.

Exit status: 0 all good; 1 some file is diverged from a peer, frozen (reset) or stuck
(paused: disk full; error: unreadable), here or, as a peer announces it, on a peer (a writer's
clear() leaves every standby's copy in_sync, and only the writer's announcement tells), or a
directory that would be an instance cannot be replicated (shown as state error, with the
reason); 2 the daemon could not be asked.

`syncd status --ready KEY [KEY...]` is for failover scripts: exit 0 only when this host can
take over every named key now (every file of it READY), 1 otherwise, with the reasons; 2
when the daemon could not be asked. READY itself is decided in syncd/readiness.py (`decide`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
import orjson

from syncd.cli.common import config_option, load_or_exit
from syncd.core.safe_text import safe, safe_json, safe_tree
from syncd.daemon.node import SOCKET_NAME
from syncd.ops.control import ControlError, query

PROBLEM_STATES = {"diverged", "reset", "paused", "error"}
EXIT_OK, EXIT_PROBLEMS, EXIT_UNREACHABLE = 0, 1, 2


@click.command("status")
@click.argument("keys", nargs=-1, metavar="[KEY]...")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
@click.option("--ready", "ready_keys", is_flag=True,
              help="Exit 0 only if this host can take over every KEY now (1 otherwise), "
                   "printing the reasons.")
@click.option("--problems", is_flag=True,
              help="Only files that need a look: frozen, paused, error, behind, or not ready.")
@click.option("--watch", is_flag=True, help="Redraw every --interval seconds until Ctrl-C.")
@click.option("--interval", default=2.0, show_default=True, type=click.FloatRange(0.2, 3600),
              help="Seconds between redraws with --watch.")
def command(keys: tuple[str, ...], config_path: Path, as_json: bool, ready_keys: bool,
            problems: bool, watch: bool, interval: float) -> None:
    """Show each replicated file's state as the running daemon sees it (only KEYs, if given).

    \b
    Exit status:
      0  no file shown is diverged, frozen or stuck (with --ready: every KEY can be taken
         over now)
      1  some file shown is diverged, reset, paused (disk full) or in error (unreadable),
         or a peer announces its copy frozen or diverged (with --ready: some KEY cannot be
         taken over)
      2  the daemon could not be asked (not running, permissions, wrong --config)
    """
    if ready_keys and not keys:
        raise click.UsageError("--ready needs at least one KEY")
    config = load_or_exit(config_path)
    if ready_keys:
        ok, text = ready_report(ask(config.state_dir), keys)
        click.echo(text)
        sys.exit(EXIT_OK if ok else EXIT_PROBLEMS)
    while True:
        whole = ask(config.state_dir)
        status = select(whole, keys, problems)
        unknown = sorted(set(keys) - {f["key"] for f in whole["files"]}
                         - {s["key"] for s in whole.get("skipped", [])})
        if unknown:
            click.echo(f"syncd status: no replicated file for {safe(', '.join(unknown))}",
                       err=True)
        if as_json:
            click.echo(safe_json(orjson.dumps(status, option=orjson.OPT_INDENT_2).decode()))
        else:
            if watch and sys.stdout.isatty():
                click.clear()
            text = render(status)
            if watch:
                text = f"{time.strftime('%H:%M:%S')}  every {interval:g}s, Ctrl-C to stop\n" + text
            click.echo(text)
        if not watch:
            break
        try:
            time.sleep(interval)  # pacing for a person, not synchronisation
        except KeyboardInterrupt:
            break
        if not sys.stdout.isatty():
            click.echo()
    if status.get("skipped", []) or any(r["conflicts"] for r in status.get("resources", [])
                                        if r["key"] in {f["key"] for f in status["files"]}) \
            or any(f["state"] in PROBLEM_STATES
            or any(p["frozen"] or p.get("diverged") for p in f["peers"].values())
            for f in status["files"]):
        sys.exit(EXIT_PROBLEMS)


def _resources(status: dict[str, Any]) -> list[str]:
    """Conflicts, refusals and transfers of the instances' resources/ (resources.py)."""
    wanted = {f["key"] for f in status["files"]}
    lines: list[str] = []
    for r in status.get("resources", []):
        if r["key"] not in wanted:
            continue
        for c in r["conflicts"]:
            at = (f"first difference at byte {c['offset']}" if c["offset"] is not None
                  else "first difference: not located yet")
            lines.append(f"{r['key']}/resources/{c['name']}: CONFLICT with {c['peer']}: "
                         f"same name, other bytes ({at}; here {c['ours']['size']} bytes, "
                         f"{c['peer']} {c['theirs']['size']} bytes): neither is replaced")
            lines.append("    resolve: move the wrong copy away on the host that holds it; "
                         "the other is fetched")
        for x in r["refused"]:
            lines.append(f"{r['key']}/resources/{x['name']}: not replicated: {x['reason']}")
        for t in r["fetching"]:
            lines.append(f"{r['key']}/resources/{t['name']}: "
                         f"{'comparing with' if t['compare'] else 'fetching from'} "
                         f"{t['peer']} ({t['got']} of {t['size']} bytes)")
    return ["", *lines] if lines else []


def _peer_limits(limits: dict[str, Any]) -> list[str]:
    """Remote growth stopped, and what peers had refused at a bound (docs/peer-limits.md)."""
    lines = []
    growth = limits.get("remote_growth", {})
    if growth.get("stopped"):
        low = ", ".join(f"{p}: {n} bytes free" for p, n in growth.get("low", {}).items())
        lines.append(f"REMOTE GROWTH STOPPED: {low}, below [limits] min_free_bytes "
                     f"({growth.get('min_free_bytes')}); no peer's bytes are written here")
    refused = limits.get("refused", {})
    if refused:
        counts = ", ".join(f"{n} {reason}" for reason, n in sorted(refused.items()))
        lines.append(f"refused at the peer limits ([limits]): {counts}")
    return ["", *lines] if lines else []


def ask(state_dir: Path) -> dict[str, Any]:
    """The running daemon's status document; exit 2 saying why when it cannot be asked."""
    try:
        status: dict[str, Any] = query(state_dir / SOCKET_NAME, "status")["status"]
    except ControlError as e:
        click.echo(f"syncd: {safe(e)}", err=True)
        sys.exit(EXIT_UNREACHABLE)
    return status


def is_problem(f: dict[str, Any]) -> bool:
    return bool(f["state"] in PROBLEM_STATES or f["state"] == "behind" or not f["ready"]
                or f.get("note"))


def select(status: dict[str, Any], keys: Iterable[str], problems: bool) -> dict[str, Any]:
    """The status with only the files asked for (all keys when none are named). Skipped
    directories are problems: they stay unless other keys are named."""
    wanted = set(keys)
    files = [f for f in status["files"] if (not wanted or f["key"] in wanted)
             and (not problems or is_problem(f))]
    skipped = [s for s in status.get("skipped", []) if not wanted or s["key"] in wanted]
    return {**status, "files": files, "skipped": skipped}


def human(n: int) -> str:
    """Bytes for people: exact below 1 KiB, else three significant digits and a binary unit."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")


def _peer(name: str, p: dict[str, Any]) -> str:
    text = f"{name}={human(p['size'])} {p['frozen'] or p['state']}"
    if p.get("lag_bytes"):
        text += f" lag {human(p['lag_bytes'])}"
        if p.get("lag_seconds") is not None:
            text += f"/{p['lag_seconds']:.1f}s"
    return text + ("" if p["online"] else " (offline)")


def summary(files: list[dict[str, Any]], skipped: int = 0) -> str:
    """One line: how many files, by state, how many are ready to take over, how many
    directories cannot be replicated."""
    by_state: dict[str, int] = {}
    for f in files:
        by_state[f["state"]] = by_state.get(f["state"], 0) + 1
    states = ", ".join(f"{n} {state}" for state, n in sorted(by_state.items()))
    # FROZEN: nothing moves for the file (a local reason: reset, a write on a replica).
    # A divergence alone isolates the peers it names; the file replicates with the others.
    frozen = sum(1 for f in files if f.get("freeze"))
    forked = sum(1 for f in files if f.get("diverged") and not f.get("freeze"))
    ready = sum(1 for f in files if f["ready"])
    return (f"{len(files)} file{'s' if len(files) != 1 else ''}"
            f"{': ' + states if states else ''}; {ready} ready to take over"
            f"{f'; {frozen} FROZEN (see above)' if frozen else ''}"
            f"{f'; {forked} with a fork (see above)' if forked else ''}"
            + (f"; {skipped} director{'ies' if skipped != 1 else 'y'} NOT REPLICATED (error, "
               "see above)" if skipped else ""))


def render(status: dict[str, Any]) -> str:
    """The status for people. Every string in it is escaped first (safe_text.py): node names,
    freeze reasons, divergence details and lines may come from peers or their bytes."""
    status = safe_tree(status)
    peers = status["peers"]
    online = sorted(n for n, p in peers.items() if p["online"])
    offline = sorted(n for n, p in peers.items() if not p["online"])
    listed = status.get("brokers", [])
    which = (f", {listed.index(status['broker']) + 1} of {len(listed)} listed"
             if len(listed) > 1 and status["broker"] in listed else "")
    head = (f"node {status['node']}  broker {status['broker']} "
            f"({'connected' if status['connected'] else 'DISCONNECTED'}{which})  "
            f"peers online: {', '.join(online) or '-'}")
    if offline:
        head += f"  offline: {', '.join(offline)}"
    rows = [("KEY", "FILE", "SIZE", "STATE", "READY", "PEERS")]
    for f in status["files"]:
        peer_text = ", ".join(_peer(n, p) for n, p in f["peers"].items()) or "-"
        rows.append((f["key"], f["file"], human(f["size"]), f["state"],
                     "yes" if f["ready"] else "no", peer_text))
    for s in status.get("skipped", []):
        rows.append((s["key"] or "-", "-", "-", "error", "no", "-"))
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
    lines += _resources(status)
    dropped = [f"peer {peer}: {b['dropped_requests']} requests dropped over its budget "
               f"([limits]), {b['served_requests']} served"
               for peer, b in status.get("peer_budgets", {}).items() if b["dropped_requests"]]
    if dropped:
        lines += ["", *dropped]
    lines += _peer_limits(status.get("peer_limits", {}))
    if status.get("skipped", []):
        lines.append("")
    for s in status.get("skipped", []):
        where = f" ({s['path']})" if s["path"] else ""
        lines.append(f"{s['key'] or s['path']}: ERROR: not replicated{where}: {s['reason']}")
    lines += ["", summary(status["files"], len(status.get("skipped", [])))]
    return "\n".join(lines)


def ready_report(status: dict[str, Any], keys: tuple[str, ...]) -> tuple[bool, str]:
    """Can this host take over every key in `keys` now? One line per key, and its reasons
    (escaped, as in `render`)."""
    status, keys = safe_tree(status), tuple(safe(k) for k in keys)
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
