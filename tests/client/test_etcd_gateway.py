"""The SDK's etcd gateway addresses: what URL an endpoint the user wrote becomes."""

from __future__ import annotations

from pathlib import Path

import pytest
from certs import make_pki

from blockx_client._etcd_gateway import EtcdAccess, Gateway


@pytest.mark.parametrize(
    ("endpoint", "tls", "url"),
    [
        ("etcd.internal", False, "http://etcd.internal:2379"),
        ("http://10.0.0.5/", False, "http://10.0.0.5:2379"),
        ("10.0.0.5:12379", True, "https://10.0.0.5:12379"),
        ("[::1]", False, "http://[::1]:2379"),
        ("[::1]:4001", False, "http://[::1]:4001"),
    ],
)
def test_a_bare_etcd_host_means_port_2379(
    endpoint: str, tls: bool, url: str, tmp_path: Path
) -> None:
    access = EtcdAccess(ca_file=str(make_pki(tmp_path).ca)) if tls else EtcdAccess()
    assert Gateway(endpoint, access).base_url == url
