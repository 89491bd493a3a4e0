"""IoSettings: the IO subsystem's tuning, as the process's configuration gives it
(declared and read in ``blockx_server.io.config``)."""

from __future__ import annotations

import msgspec


class IoSettings(msgspec.Struct, frozen=True, kw_only=True):
    cache_max_bytes: int = 256 * 1024 * 1024
    task_max_inflight: int = 64
    backend_min_concurrency: int = 1
    backend_max_concurrency: int = 64
    # Wall time a request may wait for its backend's admission; CALL_DEADLINE_MS
    # when IO_QUEUE_TIMEOUT_MS is unset.
    queue_timeout_ms: int = 5000
    retry_max_attempts: int = 3
    finality_refresh_ms: int = 1000
