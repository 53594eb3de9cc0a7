"""Server side of the control socket (`<state_dir>/syncd.sock`): status, adopt, reload.

One JSON request line per connection, then JSON reply lines (adopt streams its progress, then
its result); the client side is syncd/ops/control.py. A `status` request may carry `select`,
a list of selectors (core/selection.py): the reply then holds only the files they name.

Who may do what. The socket is mode 0660, so only root, the daemon's user and members of its
group can connect at all. Then the kernel says who connected (SO_PEERCRED, and SO_PEERGROUPS
for the supplementary groups):

- `status` only reads: anyone who can connect;
- `adopt` and `reload` change this host's copies or configuration: only root, the daemon's
  own uid, or a member of `admin_group` (default "syncd-admin": the connecting process holds
  the group, or the group database lists the user). Without such a group, only root and the
  daemon's uid. The refusal names the group needed.

Bounds, so that local clients cannot wedge or starve the daemon:

- at most MAX_CONNECTIONS connections at once. One more evicts the oldest connection that has
  not sent its request yet (idle ones cannot crowd out a `status`); when every connection is
  busy with a request, the new one gets a one-line error and is closed at once. Descriptors
  stay bounded whatever the number of clients;
- at most MAX_PER_USER of them from one uid, and RESERVED of them for root and the daemon's
  own user only: however many connections the members of group `syncd` hold, root's
  `syncd status --ready` (a failover script) gets in;
- `status` is built once for every request waiting, a slice at a time, and paced, so that
  requests take at most a third of the event loop (statusreply.py);
- the request line must arrive within IDLE_TIMEOUT seconds of connecting, and each reply line
  be taken within as long;
- a request line longer than MAX_REQUEST bytes is answered with an error.
"""

from __future__ import annotations

import asyncio
import errno
import grp
import logging
import os
import pwd
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from syncd.core.selection import MAX_SELECTORS, matching, narrow, problem
from syncd.ops.statusreply import StatusReplies

if TYPE_CHECKING:
    from syncd.daemon.host import Host

log = logging.getLogger("syncd.control")

MAX_CONNECTIONS = 64
MAX_PER_USER = 8  # connections of one uid at once (root and the daemon's own user: no limit)
RESERVED = 8  # of MAX_CONNECTIONS, only for root and the daemon's own user
# A refused connection's request is read (and dropped) for up to REFUSE_LINGER seconds before
# it is closed: a Unix socket closed with unread bytes resets the client, which would lose
# the line saying why. At most MAX_LINGERING at once; past that, closed at once.
REFUSE_LINGER = 1.0
MAX_LINGERING = 64
IDLE_TIMEOUT = 10.0
MAX_REQUEST = 64 * 1024
DISCARD_LIMIT = 16 << 20  # bytes of an over-long request read (and dropped) before replying
CHANGING = frozenset({"adopt", "reload"})
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13; not in Python's module


@dataclass(frozen=True)
class Credentials:
    """Who is at the other end of a connection, as the kernel says."""

    uid: int
    gid: int
    groups: frozenset[int]  # supplementary groups (empty if the kernel cannot say)
    user: str | None  # the uid's name in the user database, if it has one


@dataclass(frozen=True)
class AdminGroup:
    name: str
    gid: int | None  # None: no such group on this host
    members: frozenset[str]  # user names the group database lists


def lookup_group(name: str) -> AdminGroup:
    try:
        g = grp.getgrnam(name)
    except KeyError:
        return AdminGroup(name, None, frozenset())
    return AdminGroup(name, g.gr_gid, frozenset(g.gr_mem))


def may_change(who: Credentials, own_uid: int, admin: AdminGroup) -> bool:
    """Whether `who` may run a command that changes something (adopt, reload)."""
    if who.uid in (0, own_uid):
        return True
    if admin.gid is None:
        return False
    return (admin.gid == who.gid or admin.gid in who.groups
            or (who.user is not None and who.user in admin.members))


def refusal(cmd: str, own_user: str, admin: AdminGroup) -> str:
    """What a client that may not run `cmd` is told: which group it needs."""
    if admin.gid is None:
        return (f"permission denied: {cmd} changes this host; it needs root or the user "
                f"{own_user} (group {admin.name!r}, admin_group in the config, does not exist "
                "on this host)")
    return (f"permission denied: {cmd} changes this host; it needs root, the user {own_user} "
            f"or membership in group {admin.name!r} (admin_group)")


def credentials(sock: Any) -> Credentials:
    """The peer's credentials on a connected Unix socket (SO_PEERCRED, SO_PEERGROUPS)."""
    size = struct.calcsize("3i")
    _pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET,
                                                         socket.SO_PEERCRED, size))
    try:
        user: str | None = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = None
    return Credentials(uid, gid, _peer_groups(sock), user)


def _peer_groups(sock: Any) -> frozenset[int]:
    for count in (256, 65536):
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * count)
        except OSError as e:
            if e.errno == errno.ERANGE:
                continue
            return frozenset()  # an older kernel: the group database still answers
        n = len(raw) // 4
        return frozenset(struct.unpack(f"{n}I", raw[: 4 * n]))
    return frozenset()


def _own_user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _line(reply: dict[str, Any]) -> bytes:
    return orjson.dumps(reply) + b"\n"


class _TooLong(Exception):
    pass


@dataclass
class _Conn:
    uid: int  # -1: the kernel could not say
    waiting: bool = True  # no request yet: may be evicted for a newcomer


def peer_uid(sock: Any) -> int:
    """The connected process's uid (SO_PEERCRED), -1 when the kernel cannot say."""
    size = struct.calcsize("3i")
    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET,
                                                              socket.SO_PEERCRED, size))
    except (OSError, struct.error, AttributeError):
        return -1
    return int(uid)


def admission(uid: int, own_uid: int, open_total: int, open_of_uid: int
              ) -> tuple[bool, str] | None:
    """None when a new connection from `uid` may be served; else (whether closing an idle
    connection would make room, what the client is told). Pure."""
    if uid in (0, own_uid):
        limit = MAX_CONNECTIONS
    else:
        if open_of_uid >= MAX_PER_USER:
            return False, (f"too many control connections from uid {uid} ({MAX_PER_USER} at "
                           "once); try again")
        limit = MAX_CONNECTIONS - RESERVED
    if open_total >= limit:
        return True, f"too many control connections ({MAX_CONNECTIONS} busy); try again"
    return None

async def _status_reply(node: Host, replies: StatusReplies, select: object, urgent: bool
                        ) -> dict[str, Any] | bytes:
    """`status`: the whole document (shared by every request waiting: statusreply.py), or of
    what the request's `select` (selectors, selection.py) names: a `status --ready --wait`
    that polls a profile of a host with thousands of keys costs the daemon that profile's
    files only. Either way in the same paced queue."""
    if select is None:
        return await replies.line(urgent)
    if (not isinstance(select, list) or len(select) > MAX_SELECTORS
            or not all(isinstance(s, str) and problem(s) is None for s in select)):
        return {"ok": False, "error": f"select: a list of at most {MAX_SELECTORS} selectors "
                                      "(non-empty strings) expected"}
    status = await replies.selected(lambda: node.status_sliced(lambda key: matching(select, key)),
                                    urgent)
    return {"ok": True, "status": narrow(status, select)}


class ControlServer:
    def __init__(self, node: Host) -> None:
        self.node = node
        self._server: asyncio.AbstractServer | None = None
        # Open connections in arrival order, and who holds each.
        self._conns: dict[asyncio.StreamWriter, _Conn] = {}
        self._per_uid: dict[int, int] = {}
        self._lingering = 0  # refused connections whose request is being read and dropped
        self._status = StatusReplies(node.status_sliced)
        self.evicted = 0
        self.refused = 0

    async def start(self, path: Path) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path)
        os.chmod(path, 0o660)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._conns):
            w.close()
        self._conns.clear()

    @property
    def connections(self) -> int:
        return len(self._conns)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        uid = peer_uid(writer.get_extra_info("socket"))
        why = self._admit(uid)
        if why is not None:
            self.refused += 1
            writer.write(_line({"ok": False, "error": why}))
            if self._lingering < MAX_LINGERING:
                self._lingering += 1
                try:
                    async with asyncio.timeout(REFUSE_LINGER):
                        while (chunk := await reader.read(1 << 16)) and b"\n" not in chunk:
                            pass
                except (TimeoutError, ConnectionError):
                    pass
                finally:
                    self._lingering -= 1
            writer.close()
            return
        self._conns[writer] = _Conn(uid)
        self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
        try:
            await self._handle(reader, writer)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            self._forget(writer)
            writer.close()

    def _admit(self, uid: int) -> str | None:
        """None if a new connection from `uid` is served (evicting an idle one if need be)."""
        own = os.getuid()
        refused = admission(uid, own, len(self._conns), self._per_uid.get(uid, 0))
        if refused is not None and refused[0] and self._evict_idle():
            refused = admission(uid, own, len(self._conns), self._per_uid.get(uid, 0))
        return None if refused is None else refused[1]

    def _forget(self, writer: asyncio.StreamWriter) -> None:
        conn = self._conns.pop(writer, None)
        if conn is not None:
            left = self._per_uid[conn.uid] - 1
            if left:
                self._per_uid[conn.uid] = left
            else:
                del self._per_uid[conn.uid]

    def _evict_idle(self) -> bool:
        """Close the oldest connection that has sent no request yet; False if none has."""
        for w, conn in self._conns.items():
            if conn.waiting:
                self._forget(w)
                self.evicted += 1
                w.write(_line({"ok": False, "error": "closed: no request, and too many control "
                                                     "connections are open"}))
                w.close()
                return True
        return False

    async def _read_request(self, reader: asyncio.StreamReader) -> bytes:
        """The request line (without its newline), read within IDLE_TIMEOUT of connecting.
        Raises _TooLong, once the rest of an over-long line is read and dropped."""
        buf = bytearray()
        dropped = 0
        async with asyncio.timeout(IDLE_TIMEOUT):
            while True:
                chunk = await reader.read(1 << 16)
                if not chunk:
                    break  # EOF: a request without its newline is still a request
                end = chunk.find(b"\n")
                if dropped or len(buf) + (len(chunk) if end < 0 else end) > MAX_REQUEST:
                    # Read the rest of the line before replying: a Unix socket closed with
                    # unread bytes resets the client, which would lose our answer.
                    dropped += len(chunk)
                    if end >= 0 or dropped > DISCARD_LIMIT:
                        raise _TooLong
                    continue
                if end >= 0:
                    buf += chunk[:end]
                    break
                buf += chunk
        return bytes(buf)

    async def _reply(self, writer: asyncio.StreamWriter, reply: dict[str, Any] | bytes
                     ) -> None:
        writer.write(reply if isinstance(reply, bytes) else _line(reply))
        async with asyncio.timeout(IDLE_TIMEOUT):  # not wait_for: see Session.open
            await writer.drain()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await self._read_request(reader)
        except _TooLong:
            await self._reply(writer, {"ok": False, "error": (
                f"request refused: longer than {MAX_REQUEST} bytes")})
            return
        except TimeoutError:
            writer.write(_line({"ok": False, "error": (
                f"no request within {IDLE_TIMEOUT:g}s: closed")}))
            return
        conn = self._conns.get(writer)
        if conn is None:
            return  # evicted meanwhile
        conn.waiting = False  # busy: no longer evictable
        try:
            request = orjson.loads(line) if line.strip() else {}
        except orjson.JSONDecodeError:
            request = None
        if not isinstance(request, dict):
            await self._reply(writer, {"ok": False, "error": "malformed request: one JSON "
                                                             "object on one line expected"})
            return
        cmd = request.get("cmd")
        if cmd in CHANGING:
            denied = self._denied(writer, str(cmd))
            if denied is not None:
                await self._reply(writer, {"ok": False, "error": denied})
                return
        if cmd == "status":
            await self._reply(writer, await _status_reply(
                self.node, self._status, request.get("select"), conn.uid in (0, os.getuid())))
            return
        if cmd == "adopt":
            reply: dict[str, Any] = await self._adopt(request, writer)
        elif cmd == "reload":
            expected = request.get("config")
            reply = await self.node.reload_from_source(expected if isinstance(expected, str)
                                                       else None)
        else:
            reply = {"ok": False, "error": f"unknown command {str(cmd)[:100]!r}"}
        await self._reply(writer, reply)

    def _denied(self, writer: asyncio.StreamWriter, cmd: str) -> str | None:
        """None when the peer may run `cmd`, else why not (and the log says who tried)."""
        sock = writer.get_extra_info("socket")
        try:
            who = credentials(sock)
        except (OSError, struct.error) as e:
            return f"permission denied: cannot tell who is asking ({e})"
        admin = lookup_group(self.node.config.admin_group)
        if may_change(who, os.getuid(), admin):
            return None
        log.warning("control socket: %s refused to uid %d (%s): not root, the daemon's user "
                    "or in group %s", cmd, who.uid, who.user or "no user name", admin.name)
        return refusal(cmd, _own_user(), admin)

    async def _adopt(self, request: dict[str, Any], writer: asyncio.StreamWriter
                     ) -> dict[str, Any]:
        """Operator's resolution: archive our copies of KEY and take SOURCE's (streams progress).

        SOURCE may be this node: then our copy as it is now becomes the truth again (after a
        deliberate reset, say) and the peers that hold another history show as diverged until
        they adopt ours.
        """
        node = self.node
        key, source = request.get("key"), request.get("source")
        if not isinstance(key, str) or not node.config.wants_key(key):
            return {"ok": False, "error": f"{key!r} is not an instance key this node replicates"}
        if not isinstance(source, str):
            return {"ok": False, "error": "no source node given"}

        async def progress(file: str, have: int, total: int) -> None:
            await self._reply(writer, {"progress": {"file": file, "done": have, "total": total}})

        return await node.adopt(key, source, progress)
