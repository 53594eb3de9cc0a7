"""The status page of running daemons: over real HTTP, and in a real headless browser."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.support import browser
from tests.support.cluster import Broker, Daemon, free_port, wait_until
from tests.support.files import append, wait_equal
from tests.support.ishiki import ishiki_lines


def get(port: int, path: str, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def status_json(port: int) -> dict[str, Any]:
    code, _, body = get(port, "/status.json")
    assert code == 200, body
    found: dict[str, Any] = json.loads(body)
    return found


def listening(node: str, broker: Broker, make_daemon: Callable[..., Daemon]) -> tuple[Daemon, int]:
    port = free_port()
    return make_daemon(node, broker, extra=f'[metrics]\nlisten = "127.0.0.1:{port}"\n'), port


def test_page_and_json_of_a_running_pair_are_the_status_document(
    broker: Broker, make_daemon: Callable[..., Daemon]
) -> None:
    a, port_a = listening("a", broker, make_daemon)
    b, _ = listening("b", broker, make_daemon)
    append(a.path("profileA/chan_1"), ishiki_lines(30))
    wait_equal(a.path("profileA/chan_1").read_bytes(), b, key="profileA/chan_1")
    # The same document the control socket serves (`syncd status --json`).
    doc = wait_until(lambda: (s := status_json(port_a))["files"] and
                     s["files"][0]["peers"].get("b", {}).get("lag_bytes") == 0 and s, 10,
                     "a's status.json to show b caught up")
    control = a.status()
    assert doc["node"] == control["node"] == "a"
    assert doc["broker"] == control["broker"] == f"127.0.0.1:{broker.port}"
    assert [(f["key"], f["file"], f["size"]) for f in doc["files"]] == \
        [(f["key"], f["file"], f["size"]) for f in control["files"]]
    assert "telemetry" not in doc
    code, headers, body = get(port_a, "/")
    assert code == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert "script-src" not in headers["Content-Security-Policy"]
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    page = body.decode()
    assert "<h1>syncd on a</h1>" in page and "profileA/<wbr>chan_1" in page
    assert '<meta http-equiv="refresh" content="5">' in page
    assert get(port_a, "/metrics")[2].count(b"syncd_broker_connected 1.0") == 1
    assert get(port_a, "/nothing-here")[0] == 404
    # A page elsewhere that re-points its own name to 127.0.0.1 (DNS rebinding) gets nothing.
    assert get(port_a, "/status.json", host=f"rebound.example:{port_a}")[0] == 403
    assert get(port_a, "/", host=f"localhost:{port_a}")[0] == 200
    # b goes away: a's page shows it offline, behind, lagging in bytes and seconds.
    b.stop()
    append(a.path("profileA/chan_1"), ishiki_lines(3))

    def lagging() -> str | None:
        text = get(port_a, "/")[2].decode()
        return text if re.search(r"lag [0-9.]+ (B|KiB) / [0-9.]+ s · offline", text) else None

    wait_until(lagging, 15, "a's page to show b offline and lagging")


class Text(HTMLParser):
    """The text of a document as a browser shows it (style and title left out)."""

    def __init__(self, dom: str) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.tags: set[str] = set()
        self._hidden = 0
        self.feed(dom)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self._hidden += tag in ("style", "title")

    def handle_endtag(self, tag: str) -> None:
        self._hidden -= tag in ("style", "title")

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.parts.append(data)

    @property
    def shown(self) -> str:
        return re.sub(r"\s+", " ", " ".join(self.parts))


# A key and a line a hostile writer could make: quotes, markup, a terminal escape.
HOSTILE_KEY = "bot-\"'<img src=x onerror=alert(1)>"
HOSTILE_LINE = b'{"text": "<script>document.title=\'pwned\'</script> \x1b[31mred"}\n'


@pytest.mark.skipif(browser.chromium_binary() is None,
                    reason="chromium is not installed and tests/run.sh could not install it "
                           "(apt-get install chromium): the page is not tested in a browser")
def test_a_diverged_key_in_headless_chromium(tmp_path: Path, broker: Broker,
                                             make_daemon: Callable[..., Daemon]) -> None:
    a, _ = listening("a", broker, make_daemon)
    b, port = listening("b", broker, make_daemon)
    common = ishiki_lines(10)
    append(a.path(HOSTILE_KEY), common)
    wait_equal(common, b, key=HOSTILE_KEY)
    # Both hosts write after the same prefix, b's syncd paused so that neither sees the
    # other's line first: a split brain, refused by both (test_divergence.py).
    b.pause()
    append(a.path(HOSTILE_KEY), HOSTILE_LINE)
    append(b.path(HOSTILE_KEY), ishiki_lines(2))
    b.resume()

    def located() -> dict[str, Any] | None:
        for f in status_json(port)["files"]:
            d = f["diverged"].get("a", {})
            if f["key"] == HOSTILE_KEY and d.get("line"):
                return dict(d)
        return None

    found = wait_until(located, 20, "b's status.json to locate its divergence with a")
    assert found["line"] == common.count(b"\n") + 1 and found["offset"] >= len(common)
    url = f"http://127.0.0.1:{port}/"
    dom = browser.run(tmp_path, url, "--dump-dom")
    shown = Text(dom).shown
    assert "syncd on b" in shown
    assert f"{HOSTILE_KEY}/events.jsonl: DIVERGED from a: first difference at byte " \
           f"{found['offset']}, line {found['line']}" in shown
    assert "<script>document.title='pwned'</script> \\x1b[31mred" in shown  # a's line, as text
    # Nothing of the peer's became markup: no image, no script, the title is the page's.
    assert not {"img", "script"} & Text(dom).tags
    assert "pwned" not in dom.split("<title>", 1)[1].split("</title>", 1)[0]
    screenshot = tmp_path / "page.png"
    browser.run(tmp_path, url, f"--screenshot={screenshot}", "--window-size=1400,1100")
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 20_000  # a drawn page, not an empty one
    print(f"screenshot of b's status page: {screenshot}")
