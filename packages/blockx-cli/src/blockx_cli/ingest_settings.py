"""The settings ``blockx chain ingest`` reads from the environment beside its flags."""

from __future__ import annotations

import os
from typing import Final

from blockx_chain.url import WS_FORMS, InvalidWsUrl, parse_ws_url
from blockx_server.runtime.env import ConfigReader, EnvironSource
from blockx_server.runtime.settings import InvalidValue, Setting


def _ws_url(raw: str) -> str | None:
    try:
        return parse_ws_url(raw)
    except InvalidWsUrl as exc:
        raise InvalidValue(str(exc)) from None


CHAIN_WS_URL: Final = Setting[str | None](
    name="CHAIN_WS_URL",
    default=None,
    parse=_ws_url,
    help=f"the node's WebSocket where ingest --follow subscribes to newHeads: {WS_FORMS} "
    "(poll only); unset: CHAIN_RPC_URL with http→ws, https→wss",
    shown_default="derived from the HTTP URL",
)


def read_ws_url() -> str | None:
    """CHAIN_WS_URL from the environment; ConfigErrors names what is wrong with it."""
    reader = ConfigReader(EnvironSource(os.environ))
    value = reader.get(CHAIN_WS_URL)
    reader.finish()
    return value
