"""The hint under a CLI error says what to do next, per kind of client error."""

from __future__ import annotations

import pytest

from blockx_cli.runner import hint_for
from blockx_client import (
    BlockxError,
    ConnectError,
    InvalidRequestError,
    NoSlotError,
    SubmitUncertainError,
    UnavailableError,
)


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (
            SubmitUncertainError("lost after sending", "127.0.0.1:9090"),
            "`blockx get-result <task_id> --worker 127.0.0.1:9090`",
        ),
        (ConnectError("refused"), "is the cluster running?"),
        (NoSlotError("full"), "every worker is busy"),
        (UnavailableError("no worker"), "sees no live worker"),
    ],
)
def test_each_kind_gets_its_hint(error: BlockxError, words: str) -> None:
    hint = hint_for(error)
    assert hint is not None
    assert words in hint


def test_a_request_error_needs_no_hint() -> None:
    assert hint_for(InvalidRequestError("bad")) is None
