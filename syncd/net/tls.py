"""TLS to the broker: the client's SSLContext, built from `[mqtt] tls*` settings.

The broker's certificate is always verified, host name included: against tls_ca_file (a
private CA) or, without it, the system's CA store. There is deliberately no "insecure" switch;
tests make their own CA. A client certificate is sent only when tls_cert_file is set.
Files are read at each connection attempt, so renewed certificates apply on the next reconnect.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from syncd.config import ConfigError, MqttConfig


def _reason(e: Exception) -> str:
    if isinstance(e, ssl.SSLError):
        return e.reason or str(e)
    if isinstance(e, OSError):
        return e.strerror or str(e)
    return str(e)


def client_context(m: MqttConfig) -> ssl.SSLContext | None:
    """The context for aiomqtt, or None without TLS. Raises ConfigError naming the key."""
    if not m.tls:
        return None
    ca: Path | None = m.tls_ca_file
    try:
        context = ssl.create_default_context(cafile=str(ca) if ca else None)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"mqtt.tls_ca_file: cannot load {ca}: {_reason(e)}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if m.tls_cert_file is not None:
        key = m.tls_key_file
        try:
            context.load_cert_chain(str(m.tls_cert_file), str(key) if key else None)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"mqtt.tls_cert_file/tls_key_file: cannot load {m.tls_cert_file}"
                              f"{f' with {key}' if key else ''}: {_reason(e)}") from None
    return context
