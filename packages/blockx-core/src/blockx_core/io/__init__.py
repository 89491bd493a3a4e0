"""The IO subsystem's sans-IO decisions: the read cache, singleflight, per-task IO
windows, per-backend adaptive admission and the retry policy. The adapter
(``blockx_server.io``) owns the clock, the event loop and the backends."""

from blockx_core.io._admission import AdmissionCommand, Admit, BackendAdmission, QueueTimedOut
from blockx_core.io._cache import CacheKey, ReadCache, canonical_arguments
from blockx_core.io._limits import AimdLimit, ConcurrencyLimit, FixedLimit
from blockx_core.io._retry import GiveUp, IoRetryPolicy, RetryAfter, RetryDecision
from blockx_core.io._singleflight import Singleflight
from blockx_core.io._window import IoWindow

__all__ = [
    "AdmissionCommand",
    "Admit",
    "AimdLimit",
    "BackendAdmission",
    "CacheKey",
    "ConcurrencyLimit",
    "FixedLimit",
    "GiveUp",
    "IoRetryPolicy",
    "IoWindow",
    "QueueTimedOut",
    "ReadCache",
    "RetryAfter",
    "RetryDecision",
    "Singleflight",
    "canonical_arguments",
]
