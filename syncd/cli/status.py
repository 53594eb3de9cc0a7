"""`syncd status`: what the running daemon sees, per key and file and per peer.

Presentation only: the daemon's status document (`--json`) is the source of every fact; this
module filters it (SELECTOR..., --problems), sizes it for people (KiB, MiB; lag in bytes and
seconds) and adds a summary line. A SELECTOR is a key, a root's name (every key of that
profile) or a glob over keys (syncd/core/selection.py).

Exit status: 0 all good; 1 some file is diverged from a peer, frozen (reset) or stuck
(paused: disk full; error: unreadable), here or, as a peer announces it, on a peer (a writer's
clear() leaves every standby's copy in_sync, and only the writer's announcement tells), or a
directory that would be an instance cannot be replicated (shown as state error, with the
reason); 2 the daemon could not be asked.

`syncd status --ready SELECTOR...` is for failover: exit 0 only when this host can take over
every file the selectors name now (every one READY, and each selector naming at least one), 1
otherwise, with the reasons; 2 when the daemon could not be asked. With `--wait SECONDS` it
asks again until that holds (exit 0 at once) or the time is up (exit 1, with the reasons):
what a bot's unit runs before the bot starts (docs/takeover.md). READY itself is decided in
syncd/core/readiness.py (`decide`; docs/operations.md lists every reason), the verdict over
selectors in syncd/core/takeover.py.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
import orjson

from syncd.cli.common import KeyCommand, config_option, load_or_exit
from syncd.config import SOCKET_NAME
from syncd.core import selection, shellwords
from syncd.core.safe_text import safe, safe_json, safe_tree
from syncd.core.takeover import Takeover, takeover, to_json
from syncd.core.units import human_bytes
from syncd.ops.control import ControlError, Unreachable, query

PROBLEM_STATES = {"diverged", "reset", "paused", "error"}
EXIT_OK, EXIT_PROBLEMS, EXIT_UNREACHABLE = 0, 1, 2
POLL_SECONDS = 0.5  # --wait: between two questions to the daemon, at least
PROGRESS_SECONDS = 10.0  # --wait: a line on stderr this often while not ready
SHOWN = 20  # not-ready files listed per selector that names many


@click.command("status", cls=KeyCommand)
@click.argument("keys", nargs=-1, metavar="[SELECTOR]...")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
@click.option("--ready", "ready_keys", is_flag=True,
              help="Exit 0 only if this host can take over every file the SELECTORs name "
                   "now (1 otherwise), printing the reasons.")
@click.option("--wait", "wait", type=click.FloatRange(0, 7 * 86400), default=None,
              metavar="SECONDS",
              help="With --ready: ask again until everything named is ready (exit 0 at once) "
                   "or SECONDS have passed (exit 1, with the reasons).")
@click.option("--problems", is_flag=True,
              help="Only files that need a look: frozen, paused, error, behind, or not ready.")
@click.option("--watch", is_flag=True, help="Redraw every --interval seconds until Ctrl-C.")
@click.option("--interval", default=2.0, show_default=True, type=click.FloatRange(0.2, 3600),
              help="Seconds between redraws with --watch.")
def command(keys: tuple[str, ...], config_path: Path, as_json: bool, ready_keys: bool,
            wait: float | None, problems: bool, watch: bool, interval: float) -> None:
    """Show each replicated file's state as the running daemon sees it (only the keys the
    SELECTORs name, if given).

    \b
    A SELECTOR is a key (bot-1), a root's name or any level above keys (alice: every key
    alice/...), or a glob over whole keys ('alice/*', '*/group_*'; * and ? match / too).
    A selector may begin with '-' (dsh-session keys do: --home-a-proj--/SESSION).

    \b
    Exit status:
      0  no file shown is diverged, frozen or stuck (with --ready: every file named can be
         taken over now; with --wait: as soon as that holds)
      1  some file shown is diverged, reset, paused (disk full) or in error (unreadable),
         or a peer announces its copy frozen or diverged (with --ready: some file named
         cannot be taken over, or a SELECTOR names none; with --wait: still so at the end)
      2  the daemon could not be asked (not running, permissions, wrong --config; with
         --wait: not running until the end), or the arguments are wrong
    """
    if ready_keys and not keys:
        raise click.UsageError("--ready needs at least one SELECTOR (a key, a root's name, "
                               "or a glob such as 'alice/*')")
    if wait is not None and not ready_keys:
        raise click.UsageError("--wait goes with --ready")
    for s in keys:
        problem = selection.problem(s)
        if problem is not None:
            raise click.BadParameter(f"{safe(s)!r}: {problem}", param_hint="SELECTOR")
    if len(keys) > selection.MAX_SELECTORS:
        raise click.BadParameter(f"at most {selection.MAX_SELECTORS} selectors",
                                 param_hint="SELECTOR")
    config = load_or_exit(config_path)
    if ready_keys:
        sys.exit(wait_ready(config.state_dir, keys, wait or 0.0, as_json))
    while True:
        whole = ask(config.state_dir, keys)
        status = select(whole, keys, problems)
        named = {f["key"] for f in whole["files"]} | {s["key"] for s in whole.get("skipped", [])
                                                     if s["key"]}
        unknown = [s for s in keys if not any(selection.matches(s, k) for k in named)]
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
    """Conflicts, refusals and transfers of the instances' resources/ (core/resources/)."""
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
        for p in r.get("skipped_paths", []):  # links, devices, unreadable or too deep
            lines.append(f"{r['key']}/resources/{p['path']}: not followed ({p['kind']}): "
                         f"{p['reason']}")
        more = r.get("skipped_paths_count", 0) - len(r.get("skipped_paths", []))
        if more > 0:
            lines.append(f"{r['key']}/resources: and {more} more not followed (see --json)")
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


def ask(state_dir: Path, selectors: Iterable[str] = ()) -> dict[str, Any]:
    """The running daemon's status document; exit 2 saying why when it cannot be asked."""
    try:
        return ask_once(state_dir, selectors)
    except ControlError as e:
        click.echo(f"syncd: {safe(e)}", err=True)
        sys.exit(EXIT_UNREACHABLE)


def ask_once(state_dir: Path, selectors: Iterable[str] = ()) -> dict[str, Any]:
    """The status document of what `selectors` name (everything without one): the daemon
    narrows it (an older one sends everything, narrowed here too). Raises ControlError."""
    wanted = list(selectors)
    extra: dict[str, Any] = {"select": wanted} if wanted else {}
    status: dict[str, Any] = query(state_dir / SOCKET_NAME, "status", **extra)["status"]
    return selection.narrow(status, wanted)


def is_problem(f: dict[str, Any]) -> bool:
    return bool(f["state"] in PROBLEM_STATES or f["state"] == "behind" or not f["ready"]
                or f.get("note"))


def select(status: dict[str, Any], keys: Iterable[str], problems: bool) -> dict[str, Any]:
    """The status with only the files the selectors name (all when none are given), and with
    `problems` only those that need a look. Skipped directories are problems: they stay unless
    selectors name other keys."""
    narrowed = selection.narrow(status, keys)
    return {**narrowed, "files": [f for f in narrowed["files"]
                                  if not problems or is_problem(f)]}


def _peer(name: str, p: dict[str, Any]) -> str:
    text = f"{name}={human_bytes(p['size'])} {p['frozen'] or p['state']}"
    if p.get("lag_bytes"):
        text += f" lag {human_bytes(p['lag_bytes'])}"
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
    """The status for people. Every string in it is escaped first (core/safe_text.py): node names,
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
        rows.append((f["key"], f["file"], human_bytes(f["size"]), f["state"],
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
            hint = shellwords.command("syncd", "adopt", f["key"], "--from")
            lines.append(f"    resolve on the host whose copy should lose: {hint} "
                         "<node that wins>")
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
    unsafe = status.get("unsafe_paths", {})
    if unsafe.get("total"):
        kinds = ", ".join(f"{n} {k}" for k, n in unsafe["by_kind"].items())
        lines += ["", f"{unsafe['total']} entries below the roots refused, never followed "
                      f"({kinds})"]
        lines += [f"  {u['path']}: {u['reason']}" for u in unsafe.get("recent", [])[:5]]
    if status.get("skipped", []):
        lines.append("")
    for s in status.get("skipped", []):
        where = f" ({s['path']})" if s["path"] else ""
        lines.append(f"{s['key'] or s['path']}: ERROR: not replicated{where}: {s['reason']}")
    warnings = status.get("inotify", {}).get("warnings", [])
    if warnings:
        lines += ["", *(f"warning: {w}" for w in warnings)]
    lines += ["", summary(status["files"], len(status.get("skipped", [])))]
    return "\n".join(lines)


def ready_report(status: dict[str, Any], selectors: Iterable[str]) -> tuple[bool, str]:
    """Can this host take over everything `selectors` name now? (ready, the text)."""
    verdict = takeover(status, selectors)
    return verdict.ready, ready_text(verdict)


def ready_text(verdict: Takeover) -> str:
    """One line per selector, then the reasons. A selector that is one key is shown as keys
    always were (every file's reasons and notes); one that names many lists the files not
    ready (the first SHOWN), without notes. Every string escaped, as in `render`."""
    node = safe(verdict.node)
    lines = []
    for n in verdict.named:
        sel = safe(n.selector)
        if n.exact:
            if not n.files:
                lines.append(f"{sel}: NOT READY: {node} replicates no file of this key")
                continue
            lines.append(f"{sel}: {'ready' if n.ready else 'NOT READY'}")
            for f in n.files:
                lines.extend(f"  {safe(f.file)}: {safe(r)}" for r in f.reasons)
                lines.extend(f"  {safe(f.file)}: note: {safe(note)}" for note in f.notes)
            continue
        keys, files = len(n.keys), len(n.files)
        counted = f"{keys} key{'s' if keys != 1 else ''}, {files} file{'s' if files != 1 else ''}"
        if not n.files:
            lines.append(f"{sel}: NOT READY: names no file {node} replicates")
        elif n.ready:
            lines.append(f"{sel}: ready ({counted})")
        else:
            unready = n.unready
            lines.append(f"{sel}: NOT READY ({len(unready)} of {files} file"
                         f"{'s' if files != 1 else ''} not ready, {keys} key"
                         f"{'s' if keys != 1 else ''})")
            for f in unready[:SHOWN]:
                lines.extend(f"  {safe(f.key)}/{safe(f.file)}: {safe(r)}" for r in f.reasons)
            if len(unready) > SHOWN:
                lines.append(f"  ... and {len(unready) - SHOWN} more files not ready "
                             f"({shellwords.command('syncd', 'status', '--problems', sel)})")
    return "\n".join(lines)


def wait_ready(state_dir: Path, selectors: tuple[str, ...], wait: float, as_json: bool) -> int:
    """`--ready [--wait SECONDS]`: the exit status. Asks until everything named is ready or
    `wait` seconds have passed (0: once). While the daemon is not running (not started yet,
    or restarting) it is asked again too, until the deadline; any other failure to ask (no
    permission, a malformed reply) ends at once with exit 2."""
    started = time.monotonic()
    deadline = started + wait
    progress_at = started + PROGRESS_SECONDS
    said_unreachable = False
    if wait:
        click.echo(f"syncd status: waiting up to {wait:g}s until every file of "
                   f"{safe(' '.join(selectors))} is READY", err=True)
    pause = POLL_SECONDS
    while True:
        asked = time.monotonic()
        try:
            status = ask_once(state_dir, selectors)
        except Unreachable as e:
            if time.monotonic() >= deadline:
                click.echo(f"syncd: {safe(e)}" + (f"; still so after {wait:g}s" if wait else ""),
                           err=True)
                return EXIT_UNREACHABLE
            if not said_unreachable:
                click.echo(f"syncd: {safe(e)}; asking again until the {wait:g}s are up", err=True)
                said_unreachable = True
            time.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            continue
        except ControlError as e:
            click.echo(f"syncd: {safe(e)}", err=True)
            return EXIT_UNREACHABLE
        verdict = takeover(status, selectors)
        now = time.monotonic()
        # The daemon builds its whole status for each question (on its event loop): a host
        # with thousands of files is asked less often, so that waiting costs it a fifth of
        # its loop at most.
        pause = max(POLL_SECONDS, 4 * (now - asked))
        if verdict.ready or now >= deadline:
            if wait:
                click.echo(f"syncd status: {'READY' if verdict.ready else 'NOT READY'} after "
                           f"{now - started:.1f}s", err=True)
            if as_json:
                doc = {**to_json(verdict), "waited_seconds": round(now - started, 3)}
                click.echo(safe_json(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode()))
            else:
                click.echo(ready_text(verdict))
            return EXIT_OK if verdict.ready else EXIT_PROBLEMS
        if now >= progress_at:
            progress_at = now + PROGRESS_SECONDS
            click.echo(f"syncd status: not ready after {now - started:.0f}s: "
                       f"{_first_reason(verdict)}", err=True)
        # Pacing between questions to the daemon, not a wait for a condition of ours.
        time.sleep(min(pause, deadline - now))


def _first_reason(verdict: Takeover) -> str:
    for n in verdict.named:
        if not n.files:
            return f"{safe(n.selector)} names no file {safe(verdict.node)} replicates"
        for f in n.unready:
            more = verdict.unready_files - 1
            return (f"{safe(f.key)}/{safe(f.file)}: {safe('; '.join(f.reasons))}"
                    + (f" (and {more} more file{'s' if more != 1 else ''})" if more else ""))
    return "?"


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))
