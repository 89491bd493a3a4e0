"""Worker registry prefixes in etcd and their parser.

Two layouts exist: the legacy fixed prefixes and the v2 layout that carries an
environment and a lane. A Worker's key is ``prefix + workerAddr``; the trailing
``/`` of a prefix is required so that one prefix never matches another's keys.
"""

from __future__ import annotations

import enum
import re
from typing import Final

import msgspec


class RegistryKind(enum.StrEnum):
    """Which cluster a registry belongs to."""

    BLOCK = "block"
    BUNDLE = "bundle"


class RegistryFormat(enum.StrEnum):
    LEGACY = "legacy"
    V2 = "v2"


LEGACY_BLOCK_WORKER_REGISTRY_PREFIX: Final = "/blockx/workers/"
LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX: Final = "/blockx/bundle-workers/"
PROD_DEFAULT_BLOCK_WORKER_REGISTRY_PREFIX: Final = "/blockx/prod/lanes/default/workers/"
PROD_DEFAULT_BUNDLE_WORKER_REGISTRY_PREFIX: Final = "/blockx/prod/lanes/default/bundle-workers/"
TEST_DEFAULT_BLOCK_WORKER_REGISTRY_PREFIX: Final = "/blockx/test/lanes/default/workers/"
TEST_DEFAULT_BUNDLE_WORKER_REGISTRY_PREFIX: Final = "/blockx/test/lanes/default/bundle-workers/"
# The registries the operator's tools (``blockx workers``, ``tasks``, ``dashboard``)
# read when given none: the block and bundle clusters' legacy prefixes, which the
# servers' default profiles and ``blockx dev up`` register under.
DEFAULT_REGISTRY_PREFIXES: Final = (
    LEGACY_BLOCK_WORKER_REGISTRY_PREFIX,
    LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX,
)

_LEGACY: Final[dict[str, RegistryKind]] = {
    LEGACY_BLOCK_WORKER_REGISTRY_PREFIX: RegistryKind.BLOCK,
    LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX: RegistryKind.BUNDLE,
}
_V2_KIND_SEGMENT: Final[dict[str, RegistryKind]] = {
    "workers": RegistryKind.BLOCK,
    "bundle-workers": RegistryKind.BUNDLE,
}
_V2: Final = re.compile(r"/blockx/(?P<env>[^/]*)/lanes/(?P<lane>[^/]*)/(?P<kind>[^/]*)/")
_NAME: Final = re.compile(r"[a-z0-9-]+")


class RegistryPrefix(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed registry prefix. ``env`` and ``lane`` are empty for legacy prefixes."""

    prefix: str
    kind: RegistryKind
    format: RegistryFormat
    env: str = ""
    lane: str = ""


class InvalidRegistryPrefix(ValueError):
    """The string is not one of the registry prefix layouts."""


_EXPECTED: Final = (
    f"expected {LEGACY_BLOCK_WORKER_REGISTRY_PREFIX}, {LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX}, "
    "/blockx/<env>/lanes/<lane>/workers/ or /blockx/<env>/lanes/<lane>/bundle-workers/ "
    "with <env> and <lane> matching [a-z0-9-]+"
)


def parse_registry_prefix(prefix: str) -> RegistryPrefix:
    """Classify a registry prefix, or raise ``InvalidRegistryPrefix`` saying why."""
    legacy_kind = _LEGACY.get(prefix)
    if legacy_kind is not None:
        return RegistryPrefix(prefix=prefix, kind=legacy_kind, format=RegistryFormat.LEGACY)
    if prefix + "/" in _LEGACY:
        raise InvalidRegistryPrefix(f"registry prefix {prefix!r} lacks its trailing '/'")
    match = _V2.fullmatch(prefix) or _V2.fullmatch(prefix + "/")
    if match is None:
        raise InvalidRegistryPrefix(f"registry prefix {prefix!r} is not valid: {_EXPECTED}")
    if not prefix.endswith("/"):
        raise InvalidRegistryPrefix(f"registry prefix {prefix!r} lacks its trailing '/'")
    kind = _V2_KIND_SEGMENT.get(match["kind"])
    if kind is None:
        raise InvalidRegistryPrefix(
            f"registry prefix {prefix!r} ends in {match['kind']!r}: "
            "expected 'workers' or 'bundle-workers'"
        )
    for part in ("env", "lane"):
        if not _NAME.fullmatch(match[part]):
            raise InvalidRegistryPrefix(
                f"registry prefix {prefix!r} has {part} {match[part]!r}: must match [a-z0-9-]+"
            )
    return RegistryPrefix(
        prefix=prefix,
        kind=kind,
        format=RegistryFormat.V2,
        env=match["env"],
        lane=match["lane"],
    )


def v2_registry_prefix(env: str, lane: str, kind: RegistryKind) -> str:
    """Build (and validate) a v2 prefix, e.g. ``/blockx/prod/lanes/default/workers/``."""
    segment = "workers" if kind is RegistryKind.BLOCK else "bundle-workers"
    return parse_registry_prefix(f"/blockx/{env}/lanes/{lane}/{segment}/").prefix


def worker_key(prefix: str, worker_addr: str) -> str:
    """The etcd key of a Worker's heartbeat."""
    return prefix + worker_addr
