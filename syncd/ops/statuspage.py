"""The status page (`/` on the metrics listener): the daemon's status document as HTML.

`page(status, now)` is pure: the same document `syncd status --json` prints (Host.status()) in,
one self-contained HTML page out, no script in it. It reloads itself every REFRESH_SECONDS
(`<meta http-equiv="refresh">`), so it needs no JavaScript at all, and the server sends a
Content-Security-Policy (`HEADERS`) that forbids every script and allows exactly the page's own
stylesheet (by its hash): should a string ever slip through unescaped, a browser still runs
nothing.

Every string of the document goes through `_t`, which first makes control and bidi characters
visible (safe_text.safe: a peer's name or line must not reorder or hide what the page shows),
then escapes it for HTML (quotes included, so it is safe in an attribute too). Node names,
keys, file names, freeze details and divergent lines come from peers or from their bytes.
"""

from __future__ import annotations

import base64
import hashlib
import html
import time
from collections.abc import Iterable, Mapping
from typing import Any

from syncd import __version__
from syncd.core.safe_text import safe
from syncd.core.units import human_bytes

REFRESH_SECONDS = 5
ATTENTION_SHOWN = 200  # lines in "Needs attention"; the file table below has every file
PROBLEM_STATES = frozenset({"diverged", "reset", "paused", "error"})

Status = Mapping[str, Any]

_STYLE = """
:root{--bg:#f6f7f9;--card:#fff;--ink:#1d2330;--mute:#5f6b7a;--line:#e2e5ea;
--ok:#1a7f37;--ok-bg:#dafbe1;--warn:#9a6700;--warn-bg:#fff4d1;--bad:#c0262d;--bad-bg:#ffe4e2;
--info:#0b5cad;--info-bg:#ddf0ff;--idle:#57606a;--idle-bg:#eaeef2;--code:#f3f4f6}
@media (prefers-color-scheme:dark){:root{--bg:#0f1318;--card:#171c23;--ink:#e6e9ee;
--mute:#9aa5b3;--line:#2a313b;--ok:#5fd07b;--ok-bg:#12311d;--warn:#e3b341;--warn-bg:#3a2e0c;
--bad:#ff7b72;--bad-bg:#3d1518;--info:#79c0ff;--info-bg:#0f2a44;--idle:#a1acb8;
--idle-bg:#262c35;--code:#11161c}}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans","DejaVu Sans",sans-serif}
header{background:var(--card);border-bottom:1px solid var(--line);padding:14px 24px}
header h1{font-size:20px;margin:0 12px 0 0;display:inline-block;vertical-align:middle}
header .verdict{vertical-align:middle}
main{padding:16px 24px 32px;max-width:1500px}
section{background:var(--card);border:1px solid var(--line);border-radius:8px;
margin:0 0 16px;padding:12px 16px}
section h2{font-size:15px;margin:0 0 8px}
section.alert{border-left:4px solid var(--bad)}
section.alert h2{color:var(--bad)}
.facts{display:flex;flex-wrap:wrap;gap:6px 28px;margin:10px 0 0;color:var(--mute)}
.facts b{color:var(--ink);font-weight:600}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;vertical-align:top;padding:6px 10px 6px 0;border-bottom:1px solid var(--line)}
th{font-size:12px;text-transform:uppercase;letter-spacing:.04em;color:var(--mute);
font-weight:600}
tr:last-child td{border-bottom:0}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.badge{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;font-weight:600;
white-space:nowrap;background:var(--idle-bg);color:var(--idle)}
.ok{background:var(--ok-bg);color:var(--ok)}
.warn{background:var(--warn-bg);color:var(--warn)}
.bad{background:var(--bad-bg);color:var(--bad)}
.info{background:var(--info-bg);color:var(--info)}
.verdict{font-size:13px;padding:2px 12px}
ul{margin:4px 0;padding-left:18px}
ul.reasons{margin:4px 0 0;color:var(--mute);font-size:13px}
ul.attention{padding-left:20px}
ul.attention li{margin:3px 0}
ul.attention li.bad{background:none;color:var(--ink)}
ul.attention li.bad::marker{color:var(--bad)}
ul.attention li.warn{background:none;color:var(--ink)}
ul.attention li.warn::marker{color:var(--warn)}
.peer{white-space:nowrap}
.mute{color:var(--mute)}
code,.line{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:12px}
.line{display:block;background:var(--code);border-radius:4px;padding:3px 6px;margin:2px 0;
white-space:pre-wrap;word-break:break-all}
.key{font-weight:600;overflow-wrap:anywhere}
footer{color:var(--mute);font-size:12px;padding:0 24px 24px}
a{color:var(--info)}
"""

# The one stylesheet the Content-Security-Policy allows (by hash): no script, no other source.
_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()
HEADERS = (
    ("Content-Type", "text/html; charset=utf-8"),
    ("Content-Security-Policy",
     f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src data:; "
     "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)

_STATE_TONE = {"in_sync": "ok", "ahead": "info", "behind": "warn", "verifying": "info",
               "alone": "idle", "diverged": "bad", "reset": "bad", "paused": "bad",
               "error": "bad"}


def _t(value: object) -> str:
    """Any value as HTML text: controls made visible, then escaped (quotes too)."""
    return html.escape(safe(value), quote=True)


def when(ts: float | None, now: float) -> str:
    """A wall-clock time, UTC, and how long ago."""
    if not isinstance(ts, int | float):
        return "-"
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(ts))} UTC ({ago(now - ts)})"


def ago(seconds: float) -> str:
    if seconds < 0:
        return "in the future: clocks differ"
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds / length:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def _badge(text: str, tone: str, extra: str = "") -> str:
    return f'<span class="badge {tone}{extra}">{_t(text)}</span>'


def _state(state: str) -> str:
    return _badge(state, _STATE_TONE.get(state, "idle"))


def _lines(items: Iterable[str], cls: str = "reasons") -> str:
    shown = "".join(f"<li>{_t(x)}</li>" for x in items)
    return f'<ul class="{cls}">{shown}</ul>' if shown else ""


def _or_dash(value: object) -> object:
    return "-" if value is None else value


def _key(key: object) -> str:
    """A key as HTML, allowed to wrap after each '/' (keys nest: profile/channel)."""
    return "/<wbr>".join(_t(part) for part in safe(key).split("/"))


def _name(f: Mapping[str, Any]) -> str:
    return f"{f['key']}/{f['file']}"


def _resources_for(status: Status) -> list[Mapping[str, Any]]:
    return list(status.get("resources", []))


def attention(status: Status, now: float) -> list[tuple[str, str]]:
    """What needs a look, worst first: (tone, text) pairs, texts not yet escaped."""
    out: list[tuple[str, str]] = []
    if not status.get("connected"):
        out.append(("bad", f"broker {status.get('broker') or '-'}: DISCONNECTED "
                           "(peers' positions and bytes do not arrive)"))
    for f in status.get("files", []):
        name = _name(f)
        freeze = f.get("freeze")
        if freeze:
            out.append(("bad", f"{name}: {str(freeze.get('reason', '')).upper()} (frozen) since "
                               f"{when(freeze.get('since'), now)}: {freeze.get('detail', '')}"))
        for peer, d in f.get("diverged", {}).items():
            where = (f"first difference at byte {d['offset']}, line {d['line']}"
                     if d.get("line") is not None
                     else "first difference not located yet (the peer must be online)")
            out.append(("bad", f"{name}: DIVERGED from {peer}: {where}"))
        if f.get("error") or f.get("paused"):
            out.append(("bad", f"{name}: {str(f['state']).upper()}: "
                               f"{f.get('error') or f.get('paused')}"))
        for peer, p in f.get("peers", {}).items():
            if p.get("frozen") and peer not in f.get("diverged", {}):
                out.append(("warn", f"{name}: {peer} announces its copy {p['frozen']}"))
    for r in _resources_for(status):
        for c in r.get("conflicts", []):
            out.append(("bad", f"{r['key']}/resources/{c['name']}: CONFLICT with {c['peer']} "
                               "(same name, other bytes)"))
    for s in status.get("skipped", []):
        out.append(("bad", f"{s.get('key') or s.get('path')}: NOT REPLICATED: {s['reason']}"))
    for f in status.get("files", []):
        if not f.get("ready") and f.get("state") not in PROBLEM_STATES:
            reasons = "; ".join(f.get("not_ready", [])) or "not ready"
            out.append(("warn", f"{_name(f)}: not ready to take over: {reasons}"))
    for peer, b in status.get("peer_budgets", {}).items():
        if b.get("dropped_requests"):
            out.append(("warn", f"peer {peer}: {b['dropped_requests']} requests dropped over "
                                f"its budget ([limits]), {b.get('served_requests', 0)} served"))
    return out


def page(status: Status, now: float, refresh: int = REFRESH_SECONDS) -> str:
    """The whole page for one status document; `now` is the wall clock it was taken at."""
    files = list(status.get("files", []))
    node = status.get("node", "?")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{int(refresh)}">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        '<meta name="referrer" content="no-referrer">',
        '<link rel="icon" href="data:,">',
        f"<title>syncd {_t(node)}: {_t(_verdict(status)[1])}</title>",
        f"<style>{_STYLE}</style></head><body>",
        _header(status, now, refresh),
        "<main>",
        _attention(status, now),
        _divergences(status, now),
        _conflicts(status),
        _files(files),
        _peers(status, now),
        _unreplicated(status),
        "</main>",
        f'<footer>syncd {_t(__version__)} · the same data as JSON: '
        '<a href="status.json">status.json</a> · Prometheus: <a href="metrics">metrics</a> · '
        f"reloads every {int(refresh)} s</footer>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def _verdict(status: Status) -> tuple[str, str]:
    """(tone, words) for the whole host."""
    files = status.get("files", [])
    bad = sum(1 for f in files if f.get("state") in PROBLEM_STATES or f.get("freeze")
              or f.get("diverged"))
    conflicts = sum(len(r.get("conflicts", [])) for r in _resources_for(status))
    skipped = len(status.get("skipped", []))
    ready = sum(1 for f in files if f.get("ready"))
    if not status.get("connected"):
        return "bad", "broker disconnected"
    if bad or conflicts or skipped:
        n = bad + conflicts + skipped
        return "bad", f"{n} problem{'s' if n != 1 else ''}"
    if ready < len(files):
        return "warn", f"{ready} of {len(files)} files ready"
    return "ok", f"all {len(files)} file{'s' if len(files) != 1 else ''} ready"


def _header(status: Status, now: float, refresh: int) -> str:
    tone, words = _verdict(status)
    listed = list(status.get("brokers", []))
    broker = status.get("broker") or "-"
    which = (f' <span class="mute">({listed.index(broker) + 1} of {len(listed)} listed)</span>'
             if len(listed) > 1 and broker in listed else "")
    link = (_badge("connected", "ok") if status.get("connected")
            else _badge("DISCONNECTED", "bad"))
    peers = status.get("peers", {})
    online = [n for n, p in peers.items() if p.get("online")]
    files = status.get("files", [])
    by_state: dict[str, int] = {}
    for f in files:
        by_state[f.get("state", "?")] = by_state.get(f.get("state", "?"), 0) + 1
    states = ", ".join(f"{n} {s}" for s, n in sorted(by_state.items())) or "none"
    facts = [
        f"<span>broker <b>{_t(broker)}</b>{which} {link}</span>",
        f"<span>connected since <b>{_t(when(status.get('connected_since'), now))}</b></span>"
        if status.get("connected") else "",
        f"<span>peers online <b>{len(online)} of {len(peers)}</b></span>",
        f"<span>files <b>{len(files)}</b> ({_t(states)})</span>",
        f"<span>ready to take over <b>{sum(1 for f in files if f.get('ready'))}</b></span>",
        f"<span>up <b>{_t(ago(float(status.get('uptime_s', 0))).removesuffix(' ago'))}</b></span>",
        f"<span>as of <b>{_t(time.strftime('%H:%M:%S', time.gmtime(now)))} UTC</b>, "
        f"reloads every {int(refresh)} s</span>",
    ]
    return (f"<header><h1>syncd on {_t(status.get('node', '?'))}</h1>"
            f"{_badge(words, tone, ' verdict')}"
            f'<div class="facts">{"".join(x for x in facts if x)}</div></header>')


def _attention(status: Status, now: float) -> str:
    items = attention(status, now)
    if not items:
        return ""
    shown = "".join(f'<li class="{tone}">{_t(text)}</li>'
                    for tone, text in items[:ATTENTION_SHOWN])
    more = (f"<p class=\"mute\">and {len(items) - ATTENTION_SHOWN} more: see the files below</p>"
            if len(items) > ATTENTION_SHOWN else "")
    tone = "alert" if any(t == "bad" for t, _ in items) else ""
    return (f'<section class="{tone}"><h2>Needs attention ({len(items)})</h2>'
            f'<ul class="attention">{shown}</ul>{more}</section>')


def _divergences(status: Status, now: float) -> str:
    rows = []
    node = status.get("node", "?")
    for f in status.get("files", []):
        for peer, d in f.get("diverged", {}).items():
            located = d.get("line") is not None
            lines = (f'<span class="mute">here ({_t(node)}):</span>'
                     f'<span class="line">{_t(d.get("ours") or "")}</span>'
                     f'<span class="mute">{_t(peer)}:</span>'
                     f'<span class="line">{_t(d.get("theirs") or "")}</span>') if located else \
                '<span class="mute">not located yet: the peer must be online</span>'
            rows.append(
                f'<tr><td><span class="key">{_key(f["key"])}</span><br>'
                f'<span class="mute">{_t(f["file"])}</span></td>'
                f"<td>{_t(peer)}</td><td>{_t(when(d.get('since'), now))}</td>"
                f'<td class="num">{_t(d.get("offset") if located else "-")}</td>'
                f'<td class="num">{_t(d.get("line") if located else "-")}</td>'
                f"<td>{lines}<div class=\"mute\">{_t(d.get('detail', ''))}</div></td></tr>")
        freeze = f.get("freeze")
        if freeze and freeze.get("reason") == "diverged" and freeze.get("peer") not in \
                f.get("diverged", {}):
            rows.append(
                f'<tr><td><span class="key">{_key(f["key"])}</span><br>'
                f'<span class="mute">{_t(f["file"])}</span></td>'
                f"<td>{_t(freeze.get('peer') or '-')}</td>"
                f"<td>{_t(when(freeze.get('since'), now))}</td>"
                f'<td class="num">{_t(_or_dash(freeze.get("offset")))}</td>'
                f'<td class="num">{_t(_or_dash(freeze.get("line")))}</td>'
                f"<td>{_t(freeze.get('detail', ''))}</td></tr>")
    if not rows:
        return ""
    return ('<section class="alert"><h2>Divergences</h2>'
            "<table><thead><tr><th>Key / file</th><th>Peer</th><th>Since</th>"
            '<th class="num">Byte</th><th class="num">Line</th><th>The differing line</th>'
            f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            '<p class="mute">Every copy is kept as it is. Resolve on the host whose copy should '
            "lose: <code>syncd adopt KEY --from NODE-THAT-WINS</code>.</p></section>")


def _conflicts(status: Status) -> str:
    rows = []
    for r in _resources_for(status):
        for c in r.get("conflicts", []):
            at = c.get("offset")
            rows.append(
                f'<tr><td><span class="key">{_key(r["key"])}</span><br>'
                f'<span class="mute">resources/{_t(c["name"])}</span></td>'
                f"<td>{_t(c['peer'])}</td>"
                f'<td class="num">{_t(at if at is not None else "not located yet")}</td>'
                f'<td class="num">{_t(human_bytes(int(c["ours"]["size"])))}</td>'
                f'<td class="num">{_t(human_bytes(int(c["theirs"]["size"])))}</td></tr>')
        for x in r.get("refused", []):
            rows.append(f'<tr><td><span class="key">{_key(r["key"])}</span><br>'
                        f'<span class="mute">resources/{_t(x["name"])}</span></td>'
                        f'<td colspan="4">not replicated: {_t(x["reason"])}</td></tr>')
    if not rows:
        return ""
    return ('<section class="alert"><h2>Resource conflicts</h2>'
            "<table><thead><tr><th>Key / file</th><th>Peer</th>"
            '<th class="num">First difference (byte)</th><th class="num">Here</th>'
            '<th class="num">Peer\'s</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>"
            '<p class="mute">Neither copy is replaced. Move the wrong copy away on the host that '
            "holds it; the other is fetched.</p></section>")


def _peer_cell(name: str, p: Mapping[str, Any], diverged: bool) -> str:
    lag = int(p.get("lag_bytes", 0))
    seconds = p.get("lag_seconds")
    # A diverged peer never catches up with bytes of ours: its lag would mislead.
    lag_text = ("another history, no lag" if diverged else
                (f"lag {human_bytes(lag)}" + (f" / {float(seconds):.1f} s" if seconds is not None
                                       else "")) if lag else "lag 0")
    state = p.get("frozen") or p.get("state", "?")
    return (f'<div class="peer">{_t(name)} {_state(state)} '
            f'<span class="mute">{_t(human_bytes(int(p.get("size", 0))))} · {_t(lag_text)}'
            f"{'' if p.get('online') else ' · offline'}</span></div>")


def _files(files: list[Mapping[str, Any]]) -> str:
    rows = []
    for f in files:
        ready = _badge("yes", "ok") if f.get("ready") else _badge("no", "bad")
        reasons = _lines(f.get("not_ready", [])) + _lines(
            f"note: {n}" for n in f.get("notes", []))
        peers = "".join(_peer_cell(n, p, n in f.get("diverged", {}))
                        for n, p in f.get("peers", {}).items()) or \
            '<span class="mute">none heard</span>'
        rows.append(
            f'<tr><td><span class="key">{_key(f["key"])}</span></td><td>{_t(f["file"])}</td>'
            f'<td class="num">{_t(human_bytes(int(f.get("size", 0))))}</td>'
            f"<td>{_state(str(f.get('state', '?')))}</td><td>{ready}{reasons}</td>"
            f"<td>{peers}</td></tr>")
    body = "".join(rows) or '<tr><td colspan="6" class="mute">no replicated file yet</td></tr>'
    return ("<section><h2>Files</h2><table><thead><tr><th>Key</th><th>File</th>"
            '<th class="num">Size</th><th>State</th><th>Ready</th>'
            "<th>Peers: state, size, lag (bytes / seconds)</th></tr></thead>"
            f"<tbody>{body}</tbody></table></section>")


def _peers(status: Status, now: float) -> str:
    budgets = status.get("peer_budgets", {})
    worst: dict[str, tuple[int, float]] = {}
    for f in status.get("files", []):
        for n, p in f.get("peers", {}).items():
            if n in f.get("diverged", {}):
                continue  # another history: no lag (see _peer_cell)
            b, s = worst.get(n, (0, 0.0))
            worst[n] = (max(b, int(p.get("lag_bytes", 0))),
                        max(s, float(p.get("lag_seconds") or 0.0)))
    rows = []
    for n, p in status.get("peers", {}).items():
        b, s = worst.get(n, (0, 0.0))
        served = budgets.get(n, {})
        rows.append(
            f"<tr><td>{_t(n)}</td>"
            f"<td>{_badge('online', 'ok') if p.get('online') else _badge('offline', 'bad')}</td>"
            f"<td>{_t(when(p.get('since'), now))}</td>"
            f'<td class="num">{_t(human_bytes(b))}</td><td class="num">{_t(f"{s:.1f} s")}</td>'
            f'<td class="num">{_t(served.get("served_requests", 0))} / '
            f'{_t(served.get("dropped_requests", 0))}</td></tr>')
    body = "".join(rows) or '<tr><td colspan="6" class="mute">no peer heard yet</td></tr>'
    listed = status.get("brokers", [])
    brokers = ", ".join(
        f"<b>{_t(b)}</b> (in use)" if b == status.get("broker") else _t(b) for b in listed)
    return ("<section><h2>Peers</h2><table><thead><tr><th>Peer</th><th>Presence</th>"
            '<th>Since</th><th class="num">Lag, bytes (most)</th>'
            '<th class="num">Lag, seconds (most)</th>'
            '<th class="num">Requests served / dropped</th></tr></thead>'
            f"<tbody>{body}</tbody></table>"
            f'<p class="mute">Brokers listed: {brokers or "-"}; switches '
            f"{_t(status.get('broker_switches', 0))}, failed or lost connections "
            f"{_t(status.get('reconnects', 0))}, unacknowledged "
            f"{_t(human_bytes(int(status.get('queued_bytes', 0))))}, frames refused "
            f"{_t(status.get('rejected_frames', 0))}.</p></section>")


def _unreplicated(status: Status) -> str:
    rows = "".join(
        f"<tr><td><span class=\"key\">{_t(s.get('key') or '-')}</span></td>"
        f"<td><code>{_t(s.get('path') or '-')}</code></td><td>{_t(s['reason'])}</td></tr>"
        for s in status.get("skipped", []))
    if not rows:
        return ""
    return ('<section class="alert"><h2>Not replicated</h2><table><thead><tr><th>Key</th>'
            f"<th>Path</th><th>Why</th></tr></thead><tbody>{rows}</tbody></table></section>")
