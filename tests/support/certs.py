"""Throwaway X.509 certificates for TLS tests (trustme), written to files for Mosquitto and
syncd's config to name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _write(dir: Path, stem: str, cert: trustme.Blob, key: trustme.Blob) -> Issued:
    dir.mkdir(parents=True, exist_ok=True)
    out = Issued(dir / f"{stem}.crt", dir / f"{stem}.key")
    cert.write_to_path(str(out.cert))
    key.write_to_path(str(out.key))
    out.key.chmod(0o600)
    return out


class CA:
    def __init__(self, dir: Path, name: str = "syncd test CA") -> None:
        self.dir = dir
        self._ca = trustme.CA(organization_name=name)
        self.files = _write(dir, "ca", self._ca.cert_pem, self._ca.private_key_pem)

    def issue(self, cn: str, *, server: bool) -> Issued:
        """A leaf certificate with this CN; a server one is valid for 127.0.0.1 and localhost."""
        identities = ("127.0.0.1", "localhost") if server else (cn,)
        leaf = self._ca.issue_cert(*identities, common_name=cn)
        return _write(self.dir, cn, leaf.cert_chain_pems[0], leaf.private_key_pem)
