"""``syncinvoker.v1`` messages and grpclib stubs (generated into blockx_proto._gen)."""

from blockx_proto._gen.syncinvoker.v1 import *  # noqa: F403
from blockx_proto._gen.syncinvoker.v1 import __all__ as __all__
