"""Which broker to talk to: the `[mqtt] brokers` list and the policy for moving along it.

Pure: no sockets, no clock, no sleeping; the caller (net/link.py) sleeps for the delays this
returns, and tests drive it with a seeded random generator.

The policy (`Rotation`):
- Start with the first broker of the list.
- When a connection fails, or one that was up is lost, move to the next broker (round robin).
- Inside a round, the next broker is tried after a short random pause (0 .. reconnect_min),
  so that a fleet of hosts that lose one broker together does not land on the next in the
  same millisecond.
- Once a whole round has failed (every broker of the list, counting the one that was lost),
  back off: full jitter, uniform(reconnect_min, backoff), the backoff doubling after each
  failed round up to reconnect_max. A broker outage costs a round of quick attempts, then
  slower and slower rounds, never a stream of connects against dead brokers.
- A successful connection ends the outage: the next loss starts a fresh round and backoff.

With one broker every round is one attempt, which is the backoff syncd always had.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

_BRACKETED = re.compile(r"\[([0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?)\](?::(\d{1,5}))?")
_PLAIN = re.compile(r"([A-Za-z0-9_.-]+)(?::(\d{1,5}))?")


class BrokerSyntaxError(ValueError):
    """An entry of the list is not HOST:PORT (the config names key and line around it)."""


@dataclass(frozen=True, order=True)
class Broker:
    host: str
    port: int

    def __str__(self) -> str:
        """host:port, an IPv6 address in brackets: the label of status and metrics."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_broker(text: str, default_port: int) -> Broker:
    """`host:port`, `host` (the default port), `[v6]:port` or `[v6]`; raises BrokerSyntaxError."""
    text = text.strip()
    found = _BRACKETED.fullmatch(text) or _PLAIN.fullmatch(text)
    if found is None:
        hint = (" (an IPv6 address goes in brackets: [::1]:1883)" if text.count(":") > 1
                else "")
        raise BrokerSyntaxError(f"{text!r} is not HOST:PORT{hint}")
    host, port = found.group(1), found.group(2)
    if not host.strip("."):
        raise BrokerSyntaxError(f"{text!r} has no host")
    number = int(port) if port is not None else default_port
    if not 1 <= number <= 65535:
        raise BrokerSyntaxError(f"{text!r}: the port must be between 1 and 65535")
    return Broker(host, number)


def parse_brokers(entries: Sequence[str], default_port: int) -> tuple[Broker, ...]:
    """A whole list: at least one entry, each valid, none twice."""
    if not entries:
        raise BrokerSyntaxError("is empty: name at least one broker")
    out: list[Broker] = []
    for entry in entries:
        broker = parse_broker(entry, default_port)
        if broker in out:
            raise BrokerSyntaxError(f"{broker} is listed twice")
        out.append(broker)
    return tuple(out)


class Rotation:
    """Where to connect next, and how long to wait first (see the module's docstring)."""

    def __init__(self, brokers: Sequence[Broker], reconnect_min: float, reconnect_max: float,
                 rng: random.Random | None = None) -> None:
        if not brokers:
            raise ValueError("no broker")
        self.brokers = tuple(brokers)
        self._min, self._max = reconnect_min, reconnect_max
        self._rng = rng or random.Random()
        self._index = 0
        self._failed_in_round = 0
        self._backoff = reconnect_min
        self.failed_rounds = 0  # rounds in which every broker failed, since the last success

    @property
    def current(self) -> Broker:
        return self.brokers[self._index]

    @property
    def position(self) -> int:
        """1-based place of the current broker in the list."""
        return self._index + 1

    def connected(self) -> None:
        """The current broker accepted us: the outage, if any, is over."""
        self._failed_in_round = 0
        self._backoff = self._min
        self.failed_rounds = 0

    def failed(self) -> float:
        """The current broker refused us, or the connection to it was lost: move on.

        Returns the seconds to wait before connecting to the (new) current broker."""
        self._failed_in_round += 1
        self._index = (self._index + 1) % len(self.brokers)
        if self._failed_in_round < len(self.brokers):
            return self._rng.uniform(0, self._min)
        # A whole round failed: back off before the next one.
        self._failed_in_round = 0
        self.failed_rounds += 1
        delay = self._rng.uniform(self._min, self._backoff)
        self._backoff = min(self._max, self._backoff * 2)
        return delay
