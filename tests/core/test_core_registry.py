"""Registry prefixes: the legacy and v2 layouts, their parser and key builders."""

from __future__ import annotations

import pytest

from blockx_core.registry import (
    LEGACY_BLOCK_WORKER_REGISTRY_PREFIX,
    LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX,
    PROD_DEFAULT_BLOCK_WORKER_REGISTRY_PREFIX,
    PROD_DEFAULT_BUNDLE_WORKER_REGISTRY_PREFIX,
    TEST_DEFAULT_BLOCK_WORKER_REGISTRY_PREFIX,
    TEST_DEFAULT_BUNDLE_WORKER_REGISTRY_PREFIX,
    InvalidRegistryPrefix,
    RegistryFormat,
    RegistryKind,
    RegistryPrefix,
    parse_registry_prefix,
    v2_registry_prefix,
    worker_key,
)

B = RegistryKind.BLOCK
BU = RegistryKind.BUNDLE
LEGACY = RegistryFormat.LEGACY
V2 = RegistryFormat.V2

VALID = [
    # (prefix, kind, format, env, lane)
    ("/blockx/workers/", B, LEGACY, "", ""),
    ("/blockx/bundle-workers/", BU, LEGACY, "", ""),
    ("/blockx/prod/lanes/default/workers/", B, V2, "prod", "default"),
    ("/blockx/prod/lanes/default/bundle-workers/", BU, V2, "prod", "default"),
    ("/blockx/test/lanes/default/workers/", B, V2, "test", "default"),
    ("/blockx/test/lanes/default/bundle-workers/", BU, V2, "test", "default"),
    ("/blockx/staging-2/lanes/canary-01/workers/", B, V2, "staging-2", "canary-01"),
    ("/blockx/dev42/lanes/lane-7-b/bundle-workers/", BU, V2, "dev42", "lane-7-b"),
    ("/blockx/0/lanes/9/workers/", B, V2, "0", "9"),
    ("/blockx/-/lanes/--/workers/", B, V2, "-", "--"),
    # An env that spells a legacy segment is still just an env.
    ("/blockx/workers/lanes/bundle-workers/workers/", B, V2, "workers", "bundle-workers"),
]


@pytest.mark.parametrize(("prefix", "kind", "fmt", "env", "lane"), VALID)
def test_parse_valid(
    prefix: str, kind: RegistryKind, fmt: RegistryFormat, env: str, lane: str
) -> None:
    assert parse_registry_prefix(prefix) == RegistryPrefix(
        prefix=prefix, kind=kind, format=fmt, env=env, lane=lane
    )


def test_constants_parse_to_what_their_names_say() -> None:
    table = [
        (LEGACY_BLOCK_WORKER_REGISTRY_PREFIX, "/blockx/workers/", B, LEGACY),
        (LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX, "/blockx/bundle-workers/", BU, LEGACY),
        (PROD_DEFAULT_BLOCK_WORKER_REGISTRY_PREFIX, "/blockx/prod/lanes/default/workers/", B, V2),
        (
            PROD_DEFAULT_BUNDLE_WORKER_REGISTRY_PREFIX,
            "/blockx/prod/lanes/default/bundle-workers/",
            BU,
            V2,
        ),
        (TEST_DEFAULT_BLOCK_WORKER_REGISTRY_PREFIX, "/blockx/test/lanes/default/workers/", B, V2),
        (
            TEST_DEFAULT_BUNDLE_WORKER_REGISTRY_PREFIX,
            "/blockx/test/lanes/default/bundle-workers/",
            BU,
            V2,
        ),
    ]
    for constant, literal, kind, fmt in table:
        assert constant == literal
        parsed = parse_registry_prefix(constant)
        assert (parsed.kind, parsed.format) == (kind, fmt)


INVALID = [
    # (id, prefix, words the message must contain)
    ("legacy-block-no-slash", "/blockx/workers", ["trailing '/'"]),
    ("legacy-bundle-no-slash", "/blockx/bundle-workers", ["trailing '/'"]),
    ("v2-no-slash", "/blockx/prod/lanes/default/workers", ["trailing '/'"]),
    ("v2-bundle-no-slash", "/blockx/prod/lanes/default/bundle-workers", ["trailing '/'"]),
    ("env-uppercase", "/blockx/Prod/lanes/default/workers/", ["env", "'Prod'", "[a-z0-9-]+"]),
    ("env-underscore", "/blockx/my_env/lanes/default/workers/", ["env", "'my_env'"]),
    ("env-dot", "/blockx/a.b/lanes/default/workers/", ["env", "'a.b'"]),
    ("env-empty", "/blockx//lanes/default/workers/", ["env", "''"]),
    ("lane-uppercase", "/blockx/prod/lanes/Default/workers/", ["lane", "'Default'"]),
    ("lane-underscore", "/blockx/prod/lanes/lane_1/bundle-workers/", ["lane", "'lane_1'"]),
    ("lane-empty", "/blockx/prod/lanes//workers/", ["lane", "''"]),
    ("kind-unknown", "/blockx/prod/lanes/default/executors/", ["'executors'", "'workers'"]),
    ("kind-singular", "/blockx/prod/lanes/default/worker/", ["'worker'", "'bundle-workers'"]),
    ("kind-uppercase", "/blockx/prod/lanes/default/Workers/", ["'Workers'"]),
    ("kind-empty", "/blockx/prod/lanes/default//", ["''", "'workers'"]),
    ("extra-segment-v2", "/blockx/prod/lanes/default/workers/extra/", ["not valid"]),
    ("extra-segment-legacy", "/blockx/workers/extra/", ["not valid"]),
    ("double-slash-end", "/blockx/prod/lanes/default/workers//", ["not valid"]),
    ("worker-key-not-prefix", "/blockx/workers/10.0.0.1:7000", ["not valid"]),
    ("no-lanes-segment", "/blockx/prod/default/workers/", ["not valid"]),
    ("lane-instead-of-lanes", "/blockx/prod/lane/default/workers/", ["not valid"]),
    ("other-root", "/other/workers/", ["not valid"]),
    ("other-root-v2", "/other/prod/lanes/default/workers/", ["not valid"]),
    ("no-leading-slash", "blockx/workers/", ["not valid"]),
    ("no-leading-slash-v2", "blockx/prod/lanes/default/workers/", ["not valid"]),
    ("uppercase-root", "/BlockX/workers/", ["not valid"]),
    ("empty", "", ["not valid"]),
    ("root-only", "/blockx/", ["not valid"]),
    ("slash", "/", ["not valid"]),
]


@pytest.mark.parametrize(
    ("prefix", "words"),
    [(p, w) for _, p, w in INVALID],
    ids=[i for i, _, _ in INVALID],
)
def test_parse_invalid_names_the_problem(prefix: str, words: list[str]) -> None:
    with pytest.raises(InvalidRegistryPrefix) as info:
        parse_registry_prefix(prefix)
    message = str(info.value)
    assert repr(prefix) in message
    for word in words:
        assert word in message


def test_invalid_registry_prefix_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="trailing"):
        parse_registry_prefix("/blockx/workers")


V2_BUILD = [
    # (env, lane, kind, expected)
    ("prod", "default", B, "/blockx/prod/lanes/default/workers/"),
    ("prod", "default", BU, "/blockx/prod/lanes/default/bundle-workers/"),
    ("test", "default", BU, "/blockx/test/lanes/default/bundle-workers/"),
    ("stg-2", "canary-1", B, "/blockx/stg-2/lanes/canary-1/workers/"),
]


@pytest.mark.parametrize(("env", "lane", "kind", "expected"), V2_BUILD)
def test_v2_registry_prefix(env: str, lane: str, kind: RegistryKind, expected: str) -> None:
    built = v2_registry_prefix(env, lane, kind)
    assert built == expected
    parsed = parse_registry_prefix(built)
    assert (parsed.env, parsed.lane, parsed.kind, parsed.format) == (env, lane, kind, V2)


@pytest.mark.parametrize(
    ("env", "lane", "word"),
    [
        ("Prod", "default", "env"),
        ("", "default", "env"),
        ("prod", "my_lane", "lane"),
        ("prod", "", "lane"),
        ("a/b", "default", "not valid"),
    ],
)
def test_v2_registry_prefix_validates(env: str, lane: str, word: str) -> None:
    with pytest.raises(InvalidRegistryPrefix, match=word):
        v2_registry_prefix(env, lane, RegistryKind.BLOCK)


@pytest.mark.parametrize(
    ("prefix", "addr", "expected"),
    [
        ("/blockx/workers/", "10.0.0.1:7000", "/blockx/workers/10.0.0.1:7000"),
        (
            "/blockx/prod/lanes/default/bundle-workers/",
            "host:1",
            "/blockx/prod/lanes/default/bundle-workers/host:1",
        ),
    ],
)
def test_worker_key(prefix: str, addr: str, expected: str) -> None:
    key = worker_key(prefix, addr)
    assert key == expected
    assert key.startswith(prefix)
    assert key[len(prefix) :] == addr


def test_trailing_slash_keeps_prefixes_disjoint() -> None:
    # The legacy block prefix must not match keys of the legacy bundle registry and vice versa.
    block_key = worker_key(LEGACY_BLOCK_WORKER_REGISTRY_PREFIX, "w:1")
    bundle_key = worker_key(LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX, "w:1")
    assert not bundle_key.startswith(LEGACY_BLOCK_WORKER_REGISTRY_PREFIX)
    assert not block_key.startswith(LEGACY_BUNDLE_WORKER_REGISTRY_PREFIX)
