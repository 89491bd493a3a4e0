"""blockx_client: the BlockX client SDK (reserve, submit, watch, invoke).

The SDK itself lands in a later step; this package pins its place in the
workspace and its dependency on the wire contract (``blockx_proto``).
"""

from importlib.metadata import version

__version__ = version("blockx-client")

__all__ = ["__version__"]
