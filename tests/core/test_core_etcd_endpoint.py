"""etcd endpoints as ETCD_ENDPOINTS may spell them, read the same by the servers,
the CLI and the SDK."""

from __future__ import annotations

import pytest

from blockx_core.addr import etcd_host_port


@pytest.mark.parametrize(
    ("written", "host_port"),
    [
        ("10.0.0.5:12379", "10.0.0.5:12379"),
        ("etcd.internal", "etcd.internal:2379"),
        ("  http://10.0.0.5/ ", "10.0.0.5:2379"),
        ("HTTPS://etcd:4001", "etcd:4001"),
        ("[::1]", "[::1]:2379"),
        ("[::1]:4001", "[::1]:4001"),
    ],
)
def test_a_bare_host_means_2379_and_a_scheme_is_dropped(written: str, host_port: str) -> None:
    assert etcd_host_port(written) == host_port
