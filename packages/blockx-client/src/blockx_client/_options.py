"""Where a Client's calls go and how long they may take, shared by its parts."""

from __future__ import annotations

from dataclasses import dataclass

from blockx_client.backoff import RetryPolicy


@dataclass(slots=True, kw_only=True)
class ClientOptions:
    """Mutable on purpose: ``client.retry = ...`` takes effect on the next call."""

    coordinator: str
    bundle_coordinator: str | None
    sync_invoker: str
    retry: RetryPolicy
    rpc_timeout_s: float
