"""The status page as a pure function of the status document, the snapshot cache and the routes."""

from __future__ import annotations

import base64
import copy
import hashlib
import re
from html.parser import HTMLParser
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syncd.ops import statuspage
from syncd.ops.metrics import SnapshotCache, host_allowed, routes

NOW = 1_800_000_000.0


def document() -> dict[str, Any]:
    """A status document with something in every section (the shape Host.status() has)."""
    peer = {"size": 4096, "state": "in_sync", "frozen": None, "diverged": [], "online": True,
            "lag_bytes": 0, "lag_seconds": 0.0, "offline_since": None, "heard_at": NOW - 1}
    return {
        "node": "host-a", "broker": "mqtt-2:8883", "brokers": ["mqtt-1:8883", "mqtt-2:8883"],
        "broker_switches": 1, "connected": True, "connected_since": NOW - 120,
        "queued_bytes": 0, "publishes_dropped": 0, "reconnects": 3,
        "peers": {"host-b": {"online": True, "since": NOW - 100},
                  "host-c": {"online": False, "since": NOW - 7200}},
        "ready_count": {"yes": 1, "no": 2}, "rejected_frames": 0,
        "peer_budgets": {"host-b": {"served_requests": 5, "served_bytes": 10,
                                    "dropped_requests": 2, "dropped_bytes": 9}},
        "uptime_s": 4000.0,
        "files": [
            {"key": "alice/chan_1", "file": "events.jsonl", "size": 4096, "state": "in_sync",
             "ready": True, "not_ready": [], "notes": ["host-c offline since ...: a note"],
             "freeze": None, "diverged": {},
             "peers": {"host-b": peer,
                       "host-c": {**peer, "online": False, "size": 2048, "state": "behind",
                                  "lag_bytes": 2048, "lag_seconds": 75.5}}},
            {"key": "bot-1", "file": "events.jsonl", "size": 9000, "state": "diverged",
             "ready": False,
             "not_ready": ["diverged from host-b since ...: the copies differ"],
             "notes": [], "freeze": None,
             "diverged": {"host-b": {"reason": "diverged", "since": NOW - 60, "peer": "host-b",
                                     "detail": "host-b announced a copy whose prefix differs",
                                     "offset": 2192, "line": 6, "ours": '{"n": 6}',
                                     "theirs": '{"n": "six"}'}},
             "peers": {"host-b": {**peer, "size": 8000, "state": "diverged",
                                  "diverged": ["host-a"], "lag_bytes": 1000,
                                  "lag_seconds": 1.25}}},
            {"key": "bot-2", "file": "events.jsonl", "size": 10, "state": "reset",
             "ready": False, "not_ready": ["frozen: reset"], "notes": [],
             "freeze": {"reason": "reset", "detail": "the file was truncated to 10 bytes",
                        "since": NOW - 30, "peer": None, "offset": None, "line": None,
                        "ours": None, "theirs": None},
             "diverged": {}, "peers": {}},
        ],
        "resources": [{"key": "alice/chan_1", "files": 3, "bytes": 100, "manifest": "ab",
                       "fetching": [], "refused": [{"name": "huge.bin", "reason": "too large"}],
                       "conflicts": [{"name": "avatar.png", "peer": "host-b", "offset": 17,
                                      "ours": {"size": 300, "sha256": "00"},
                                      "theirs": {"size": 310, "sha256": "11"}}]}],
        "skipped": [{"key": "bad\\xff", "path": "/rt/bad\\xff", "reason": "not valid UTF-8"}],
        "telemetry": {"frames": []},
    }


class Parsed(HTMLParser):
    """Every start tag with its attributes, and the text a browser would show."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []
        self._skip = 0
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        if tag in ("style", "title"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "title"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.text.append(data)

    @property
    def shown(self) -> str:
        return re.sub(r"\s+", " ", " ".join(self.text))


ALLOWED_TAGS = {"html", "head", "meta", "link", "title", "style", "body", "header", "h1", "h2",
                "main", "section", "table", "thead", "tbody", "tr", "th", "td", "ul", "li",
                "span", "b", "div", "p", "code", "br", "wbr", "footer", "a"}


def test_every_file_state_ready_reasons_and_lag_per_peer_in_bytes_and_seconds() -> None:
    shown = Parsed(statuspage.page(document(), NOW)).shown
    for text in ("alice/ chan_1", "bot-1", "bot-2", "in_sync", "diverged", "reset",
                 "diverged from host-b since ...: the copies differ", "frozen: reset",
                 "note: host-c offline since ...: a note",
                 "host-c behind 2 KiB · lag 2 KiB / 75.5 s · offline",
                 "host-b diverged 7.81 KiB · another history, no lag"):
        assert text in shown, text
    assert "ready to take over 1" in shown


def test_a_divergence_shows_its_offset_line_and_both_lines() -> None:
    shown = Parsed(statuspage.page(document(), NOW)).shown
    assert "bot-1/events.jsonl: DIVERGED from host-b: first difference at byte 2192, line 6" \
        in shown
    assert 'here (host-a): {"n": 6} host-b: {"n": "six"}' in shown
    assert "syncd adopt KEY --from NODE-THAT-WINS" in shown
    assert "bot-2/events.jsonl: RESET (frozen) since 2027-01-15 07:59:30 UTC (30 s ago): " \
           "the file was truncated to 10 bytes" in shown


def test_conflicts_unreplicated_directories_broker_and_peers() -> None:
    shown = Parsed(statuspage.page(document(), NOW)).shown
    assert "alice/chan_1/resources/avatar.png: CONFLICT with host-b" in shown
    assert "resources/huge.bin not replicated: too large" in shown
    assert "bad\\xff /rt/bad\\xff not valid UTF-8" in shown
    assert "broker mqtt-2:8883 (2 of 2 listed) connected" in shown
    assert "Brokers listed: mqtt-1:8883, mqtt-2:8883 (in use); switches 1, failed or lost " \
           "connections 3" in shown
    assert "host-c offline 2027-01-15 06:00:00 UTC (2 h ago) 2 KiB 75.5 s 0 / 0" in shown
    assert "peer host-b: 2 requests dropped over its budget" in shown
    assert "peers online 1 of 2" in shown


def test_the_verdict_names_the_worst_first() -> None:
    doc = document()
    assert statuspage._verdict(doc) == ("bad", "4 problems")  # bot-1, bot-2, avatar, bad\xff
    healthy = {**doc, "files": doc["files"][:1], "resources": [], "skipped": []}
    assert statuspage._verdict(healthy) == ("ok", "all 1 file ready")
    healthy["files"] = [{**doc["files"][0], "ready": False}]
    assert statuspage._verdict(healthy) == ("warn", "0 of 1 files ready")
    assert statuspage._verdict({**healthy, "connected": False}) == ("bad",
                                                                    "broker disconnected")


def test_it_reloads_itself_runs_no_script_and_its_style_is_the_one_the_policy_allows() -> None:
    text = statuspage.page(document(), NOW)
    parsed = Parsed(text)
    assert ("meta", [("http-equiv", "refresh"), ("content", "5")]) in parsed.tags
    assert {tag for tag, _ in parsed.tags} <= ALLOWED_TAGS
    style = text.split("<style>", 1)[1].split("</style>", 1)[0]
    digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
    policy = dict(statuspage.HEADERS)["Content-Security-Policy"]
    assert f"style-src 'sha256-{digest}'" in policy
    assert "default-src 'none'" in policy and "script-src" not in policy


HOSTILE = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "' onmouseover='alert(1)",
    "</style><script>x()</script>",
    "</textarea></title><b>bold</b>",
    "\x1b[2J\x1b]0;owned\x07 \x00 \x7f \x9b",
    "\u202eevil\u2066 \u2028",
    "&amp; &#60;script&#62;",
]


NAMED = {"peers", "diverged", "peer_budgets"}  # maps keyed by node name


def poisoned(value: Any, payload: str) -> Any:
    """Every string of a document, node names as keys too, with `payload` added: the same
    string always becomes the same, so names still match across sections."""
    if isinstance(value, str):
        return value + payload
    if isinstance(value, dict):
        return {k: ({poisoned(n, payload): poisoned(x, payload) for n, x in v.items()}
                    if k in NAMED and isinstance(v, dict) else poisoned(v, payload))
                for k, v in value.items()}
    if isinstance(value, list):
        return [poisoned(v, payload) for v in value]
    return value


def assert_inert(text: str, payload: str) -> None:
    parsed = Parsed(text)
    assert {tag for tag, _ in parsed.tags} <= ALLOWED_TAGS
    for tag, attrs in parsed.tags:
        for name, _ in attrs:
            assert not name.startswith("on"), (tag, attrs)
        if tag == "img" or tag == "script":
            raise AssertionError(tag)
    assert "<script" not in text.lower() and "<img" not in text.lower()
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028]", text)
    # What the peer sent is shown, as text (controls as visible escapes).
    visible = payload
    for raw, shown in (("\x1b", "\\x1b"), ("\x07", "\\x07"), ("\x00", "\\x00"),
                       ("\x7f", "\\x7f"), ("\x9b", "\\x9b"), ("\u202e", "\\u202e"),
                       ("\u2066", "\\u2066"), ("\u2028", "\\u2028")):
        visible = visible.replace(raw, shown)
    assert visible.strip() in "".join(parsed.text)


@pytest.mark.parametrize("payload", HOSTILE)
def test_hostile_names_details_and_lines_are_escaped_everywhere(payload: str) -> None:
    doc = poisoned(document(), payload)
    # Numbers stay numbers; the names, states, reasons, details and lines all carry it.
    assert "host-b" + payload in doc["peers"]
    assert_inert(statuspage.page(doc, NOW), payload)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_any_node_name_key_or_line_at_all_stays_text(name: str) -> None:
    doc = copy.deepcopy(document())
    doc["node"] = name
    doc["peers"][name] = {"online": True, "since": NOW}
    f = doc["files"][1]
    f["key"] = name
    f["diverged"][name] = {**f["diverged"]["host-b"], "ours": name, "theirs": name}
    text = statuspage.page(doc, NOW)
    parsed = Parsed(text)
    assert {tag for tag, _ in parsed.tags} <= ALLOWED_TAGS
    assert all(not a.startswith("on") for _, attrs in parsed.tags for a, _ in attrs)


# --- the snapshot cache and the routes (no sockets: WSGI called directly) --------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_snapshot_serves_every_request_for_a_second() -> None:
    clock, taken = Clock(), []

    def take() -> dict[str, Any]:
        taken.append(clock.now)
        return {**document(), "uptime_s": float(len(taken))}

    cache = SnapshotCache(take, max_age=1.0, clock=clock)
    made: list[float] = []

    def make(status: Any, wall: float) -> bytes:
        made.append(status["uptime_s"])
        return b"page"

    for _ in range(50):
        assert cache.get()["uptime_s"] == 1.0
        assert cache.made("/", make) == b"page"
    assert taken == [100.0] and made == [1.0]
    clock.now += 0.99
    cache.made("/", make)
    assert cache.taken == 1
    clock.now += 0.01
    assert cache.get()["uptime_s"] == 2.0
    cache.made("/", make)
    assert taken == [100.0, 101.0] and made == [1.0, 2.0]


def call(app: Any, path: str, method: str = "GET", host: str = "127.0.0.1:9464"
         ) -> tuple[str, dict[str, str], bytes]:
    got: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        got.update(status=status, headers=dict(headers))

    environ = {"PATH_INFO": path, "REQUEST_METHOD": method, "HTTP_HOST": host}
    body = b"".join(app(environ, start_response))
    return got["status"], got["headers"], body


def metrics_app(environ: Any, start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"syncd_broker_connected 1\n"]


def test_routes_page_json_metrics_and_nothing_else() -> None:
    app = routes(SnapshotCache(document), metrics_app)
    status, headers, body = call(app, "/")
    assert status == "200 OK" and headers["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert int(headers["Content-Length"]) == len(body) and b"syncd on host-a" in body
    status, headers, body = call(app, "/status.json")
    assert status == "200 OK" and headers["Content-Type"] == "application/json"
    expected = {k: v for k, v in document().items() if k != "telemetry"}
    assert orjson.loads(body) == expected
    assert call(app, "/metrics")[2] == b"syncd_broker_connected 1\n"
    status, headers, body = call(app, "/", "HEAD")
    assert status == "200 OK" and body == b"" and int(headers["Content-Length"]) > 0
    assert call(app, "/", "POST")[0] == "405 Method Not Allowed"
    assert call(app, "/favicon.ico")[0] == "404 Not Found"
    assert call(app, "/../etc/passwd")[0] == "404 Not Found"


def test_a_daemon_that_does_not_answer_gets_503_not_a_stack_trace() -> None:
    def take() -> dict[str, Any]:
        raise TimeoutError("the event loop did not answer within 10 s")

    status, _, body = call(routes(SnapshotCache(take), metrics_app), "/")
    assert status == "503 Service Unavailable"
    assert body == b"syncd did not answer: TimeoutError the event loop did not answer within " \
                   b"10 s\n"


@pytest.mark.parametrize(("host", "allowed"), [
    ("127.0.0.1:9464", True), ("127.0.0.1", True), ("[::1]:9464", True), ("10.1.2.3:80", True),
    ("localhost:9464", True), ("LOCALHOST", True), ("bot-a:9464", True),
    ("bot-a.example.org.:9464", False), ("bot-a.:9464", True), (None, True), ("", True),
    ("attacker.example:9464", False), ("127.0.0.1.attacker.example", False),
    ("localhost.attacker.example:9464", False), ("[::1", False),
])
def test_only_a_host_that_names_this_machine_gets_the_page(host: str | None,
                                                            allowed: bool) -> None:
    assert host_allowed(host, frozenset({"localhost", "bot-a"})) is allowed


def test_a_rebound_name_is_refused_the_page_and_the_json_not_the_metrics() -> None:
    app = routes(SnapshotCache(document), metrics_app, frozenset({"localhost", "bot-a"}))
    for path in ("/", "/status.json"):
        status, _, body = call(app, path, host="attacker.example:9464")
        assert status == "403 Forbidden"
        assert body.startswith(b"refused: Host 'attacker.example:9464' is neither an IP address")
        assert call(app, path, host="bot-a:9464")[0] == "200 OK"
    assert call(app, "/metrics", host="attacker.example:9464")[0] == "200 OK"
