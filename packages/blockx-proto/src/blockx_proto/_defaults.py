"""betterproto2's field defaults without a ``warnings.catch_warnings`` per field.

``Message.__bytes__`` and ``Message.__bool__`` compare every field with its default,
which betterproto2 0.10 makes inside ``warnings.catch_warnings()`` (for deprecated
fields' defaults): about half of encoding a message, on every hop. The default
factories of the generated messages return ``None``, a scalar zero, an empty
list or an enum's zero, and none of them warns (no field or message of the
``.proto`` sources is deprecated), so they are called directly here. The wire
bytes and every ``bool`` are the same (``tests/proto/test_proto_generated.py``).
"""

from __future__ import annotations

from typing import Any, Final

import betterproto2

ORIGINAL_FIELD_DEFAULT: Final = betterproto2.Message._get_field_default


def _field_default(self: betterproto2.Message, field_name: str) -> Any:
    return self._betterproto.default_gen[field_name]()  # type: ignore[arg-type]


def install() -> None:
    betterproto2.Message._get_field_default = _field_default  # type: ignore[method-assign]
