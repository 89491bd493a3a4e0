"""Coordinator configuration: environment parsing, validation, profiles."""

from __future__ import annotations

import pytest

from blockx_core.coordinator import CoordinatorConfig
from blockx_core.registry import RegistryKind
from blockx_server.coordinator.config import (
    BLOCK_PROFILE,
    BUNDLE_PROFILE,
    load_coordinator_config,
)
from blockx_server.runtime.env import ConfigError


def test_defaults() -> None:
    cfg = load_coordinator_config(BLOCK_PROFILE, {})
    assert (cfg.listen_host, cfg.listen_port) == ("", 8080)
    assert cfg.watcher.endpoints == ("localhost:2379",)
    assert cfg.watcher.key_prefixes == ("/blockx/workers/",)
    assert cfg.watcher.dial_timeout_ms == 5000
    assert cfg.watcher.retry_delay_ms == 1000
    assert cfg.worker_rpc_timeout_ms == 3000
    assert cfg.handler.max_timeout_retries == 1
    assert cfg.core == CoordinatorConfig(
        heartbeat_timeout_ms=10_000,
        watch_grace_period_ms=10_000,
        slot_ttl_ms=5_000,
        max_candidates=3,
        circuit_breaker_threshold=3,
        circuit_breaker_cooldown_ms=10_000,
        cpu_red_line=0.90,
        memory_red_line=0.90,
        error_rate_red_line=0.50,
    )
    assert cfg.prometheus_listen is None
    assert cfg.prometheus_path == "/metrics"
    assert cfg.cpu_profile_path is None
    assert cfg.log_level == "INFO"


def test_bundle_profile_defaults() -> None:
    cfg = load_coordinator_config(BUNDLE_PROFILE, {})
    assert cfg.profile.deployment is RegistryKind.BUNDLE
    assert cfg.profile.service == "bundlecoordinator.v1.BundleCoordinatorService"
    assert cfg.watcher.key_prefixes == (
        "/blockx/bundle-workers/",
        "/blockx/prod/lanes/default/bundle-workers/",
    )


def test_every_variable_is_read() -> None:
    env = {
        "COORDINATOR_LISTEN": "127.0.0.1:9001",
        "ETCD_ENDPOINTS": "http://10.0.0.1:2379, 10.0.0.2:2379",
        "COORDINATOR_REGISTRY_PREFIXES": "/blockx/test/lanes/default/workers/,/blockx/workers/",
        "COORDINATOR_WORKER_RPC_TIMEOUT_MS": "100",
        "COORDINATOR_ETCD_DIAL_TIMEOUT_MS": "200",
        "COORDINATOR_ETCD_WATCH_RETRY_DELAY_MS": "300",
        "COORDINATOR_HEARTBEAT_TIMEOUT_MS": "4000",
        "COORDINATOR_WATCH_GRACE_PERIOD_MS": "3000",
        "COORDINATOR_SLOT_TTL_MS": "2000",
        "COORDINATOR_MAX_CANDIDATES": "5",
        "COORDINATOR_MAX_TIMEOUT_RETRIES": "0",
        "COORDINATOR_CIRCUIT_BREAKER_THRESHOLD": "7",
        "COORDINATOR_CIRCUIT_BREAKER_COOLDOWN_MS": "600",
        "COORDINATOR_CPU_RED_LINE": "1",
        "COORDINATOR_MEMORY_RED_LINE": "0.5",
        "COORDINATOR_ERROR_RATE_RED_LINE": "0.25",
        "BLOCKX_PROMETHEUS_LISTEN_ADDR": ":9102",
        "BLOCKX_PROMETHEUS_PATH": "/prom",
        "COORDINATOR_CPU_PROFILE": "/tmp/cpu.prof",
        "BLOCKX_LOG_LEVEL": "debug",
    }
    cfg = load_coordinator_config(BLOCK_PROFILE, env)
    assert (cfg.listen_host, cfg.listen_port) == ("127.0.0.1", 9001)
    assert cfg.watcher.endpoints == ("http://10.0.0.1:2379", "10.0.0.2:2379")
    assert cfg.watcher.key_prefixes == ("/blockx/test/lanes/default/workers/", "/blockx/workers/")
    assert (cfg.worker_rpc_timeout_ms, cfg.watcher.dial_timeout_ms) == (100, 200)
    assert cfg.watcher.retry_delay_ms == 300
    assert cfg.core == CoordinatorConfig(
        heartbeat_timeout_ms=4000,
        watch_grace_period_ms=3000,
        slot_ttl_ms=2000,
        max_candidates=5,
        circuit_breaker_threshold=7,
        circuit_breaker_cooldown_ms=600,
        cpu_red_line=1.0,
        memory_red_line=0.5,
        error_rate_red_line=0.25,
    )
    assert cfg.handler.max_timeout_retries == 0
    assert cfg.prometheus_listen == ("", 9102)
    assert cfg.prometheus_path == "/prom"
    assert cfg.cpu_profile_path == "/tmp/cpu.prof"
    assert cfg.log_level == "DEBUG"


BAD = [
    # (variable, value, words the message must contain)
    ("COORDINATOR_MAX_CANDIDATES", "0", ">= 1"),
    ("COORDINATOR_MAX_CANDIDATES", "three", "integer"),
    ("COORDINATOR_CIRCUIT_BREAKER_THRESHOLD", "0", ">= 1"),
    ("COORDINATOR_MAX_TIMEOUT_RETRIES", "-1", ">= 0"),
    ("COORDINATOR_HEARTBEAT_TIMEOUT_MS", "0", "> 0"),
    ("COORDINATOR_SLOT_TTL_MS", "-5", "> 0"),
    ("COORDINATOR_CIRCUIT_BREAKER_COOLDOWN_MS", "0", "> 0"),
    ("COORDINATOR_WORKER_RPC_TIMEOUT_MS", "0", "> 0"),
    ("COORDINATOR_ETCD_DIAL_TIMEOUT_MS", "-1", "> 0"),
    ("COORDINATOR_ETCD_WATCH_RETRY_DELAY_MS", "0", "> 0"),
    ("COORDINATOR_CPU_RED_LINE", "0", "(0, 1]"),
    ("COORDINATOR_MEMORY_RED_LINE", "1.5", "(0, 1]"),
    ("COORDINATOR_ERROR_RATE_RED_LINE", "half", "number"),
    ("COORDINATOR_WATCH_GRACE_PERIOD_MS", "10001", "<= COORDINATOR_HEARTBEAT_TIMEOUT_MS"),
    ("COORDINATOR_LISTEN", "8080", "host:port"),
    ("COORDINATOR_LISTEN", ":99999", "host:port"),
    ("ETCD_ENDPOINTS", "localhost:port", "host:port"),
    ("ETCD_ENDPOINTS", "[::1", "host:port"),
    ("ETCD_ENDPOINTS", "a:1,,b:2", "empty item"),
    ("COORDINATOR_REGISTRY_PREFIXES", "/blockx/workers", "trailing"),
    ("COORDINATOR_REGISTRY_PREFIXES", "/blockx/Prod/lanes/default/workers/", "[a-z0-9-]+"),
    ("COORDINATOR_REGISTRY_PREFIXES", "/blockx/bundle-workers/", "bundle registry"),
    ("COORDINATOR_REGISTRY_PREFIXES", "/blockx/workers/,/blockx/workers/", "twice"),
    ("BLOCKX_PROMETHEUS_LISTEN_ADDR", "nowhere", "host:port"),
    ("BLOCKX_PROMETHEUS_PATH", "metrics", "start with '/'"),
    ("BLOCKX_LOG_LEVEL", "loud", "one of"),
]


@pytest.mark.parametrize(("variable", "value", "words"), BAD)
def test_bad_value_names_the_variable(variable: str, value: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_coordinator_config(BLOCK_PROFILE, {variable: value})
    assert err.value.variable == variable
    message = str(err.value)
    assert message.startswith(variable)
    assert words in message
    assert "\n" not in message


def test_bundle_deployment_refuses_a_block_prefix() -> None:
    with pytest.raises(ConfigError) as err:
        load_coordinator_config(
            BUNDLE_PROFILE, {"COORDINATOR_REGISTRY_PREFIXES": "/blockx/prod/lanes/x/workers/"}
        )
    assert "block registry" in str(err.value)
    assert "bundle deployment" in str(err.value)


def test_grace_equal_to_heartbeat_timeout_is_allowed() -> None:
    cfg = load_coordinator_config(
        BLOCK_PROFILE,
        {"COORDINATOR_WATCH_GRACE_PERIOD_MS": "5000", "COORDINATOR_HEARTBEAT_TIMEOUT_MS": "5000"},
    )
    assert cfg.core.watch_grace_period_ms == cfg.core.heartbeat_timeout_ms == 5000


def test_profiles_serve_their_own_service() -> None:
    assert BLOCK_PROFILE.deployment is RegistryKind.BLOCK
    assert BLOCK_PROFILE.service == "coordinator.v1.CoordinatorService"
    assert BLOCK_PROFILE.registry_prefixes == ("/blockx/workers/",)
    assert BUNDLE_PROFILE.deployment is RegistryKind.BUNDLE
