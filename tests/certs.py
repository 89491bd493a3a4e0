"""Certificates made by the tests: one CA, leaf certificates for 127.0.0.1 signed by
it, and a second CA nobody trusts (an attacker's)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class Leaf:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: Path
    # Valid for 127.0.0.1 and localhost, for server and client authentication alike.
    server: Leaf
    client: Leaf
    # Signed by a CA ``ca`` does not trust.
    stranger: Leaf
    stranger_ca: Path


def _leaf(ca: trustme.CA, directory: Path, name: str) -> Leaf:
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    return Leaf(cert, key)


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, stranger_ca = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    stranger_ca.cert_pem.write_to_path(str(directory / "stranger-ca.pem"))
    return Pki(
        ca=directory / "ca.pem",
        server=_leaf(ca, directory, "server"),
        client=_leaf(ca, directory, "client"),
        stranger=_leaf(stranger_ca, directory, "stranger"),
        stranger_ca=directory / "stranger-ca.pem",
    )
