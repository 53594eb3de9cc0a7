"""Text from the network, made safe to print on an operator's terminal.

Peer node names, freeze reasons and divergence details a peer announced, lines of a log that
came from another host: any of them may hold control characters. Printed raw, ESC sequences
can rewrite the screen, retitle the window, hide or forge lines of output (and some terminals
answer queries as if typed); C1 controls (U+0080-U+009F, CSI among them) and Unicode's bidi
overrides do the same or reorder what is shown. Every human output of the CLI passes such text
through `safe` (or a whole status document through `safe_tree`) first.

`safe` escapes each such character as a visible, Python-style escape (`\\x1b`, `\\u202e`),
newlines and tabs included: one field stays on one line. Everything else, other Unicode text
included, is left as it is, and so are backslashes (JSON lines are full of them), so an
escape in the output may also be the peer's literal text; it never is a raw control.
`safe_json` does the same to JSON text, with JSON's `\\uXXXX` escapes, which keeps every value
as it was (JSON escapes C0 controls itself, but not DEL, C1 or bidi controls).

Pure functions, no I/O.
"""

from __future__ import annotations

import re
from typing import Any

# C0 controls, DEL, C1 controls; bidi embeddings, overrides and isolates, and the marks that
# reorder text; line and paragraph separators, which some terminals break lines on.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: object) -> str:
    """`text` (anything: it is str()'d) with every control character visibly escaped."""
    return _UNSAFE.sub(_escape, text if isinstance(text, str) else str(text))


def safe_tree(value: Any) -> Any:
    """A copy of a JSON-like document with every string, dict keys included, made `safe`."""
    if isinstance(value, str):
        return safe(value)
    if isinstance(value, dict):
        return {safe_tree(k): safe_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [safe_tree(v) for v in value]
    return value


def safe_json(text: str) -> str:
    """Serialised JSON with the controls JSON leaves raw written as `\\uXXXX` (same values)."""
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
