"""The Writer Plugins of each cluster: one module each, one registration line each.

| block Worker | BlockWriteResultHandler = BlockTableWriteHandler (per block),
|              | TableUpsertsResultHandler = NormalTableWriteHandler,
|              | ReturnValueResultHandler = ReturnValueHandler
| bundle Worker | BlockBundleWriteResultHandler = BlockTableWriteHandler (per bundle),
|               | TableUpsertsResultHandler = NormalTableWriteHandler
| both          | IcebergWriteResultHandler = IcebergTableWriteHandler (an Iceberg
|               | table of the lake, one commit per task)

A name the Worker lacks fails PLUGIN_NOT_FOUND, naming the cluster that has it.
The bundle Worker has no ReturnValue handler: its tasks write into tables.
"""

from blockx_core.registry import RegistryKind
from blockx_server.pipeline.plugins import PluginError
from blockx_server.pipeline.writers.base import (
    WriterPlugin,
    Writers,
    failed_writer_result,
)
from blockx_server.pipeline.writers.block_bundle_write import BlockBundleWriteResultHandler
from blockx_server.pipeline.writers.block_write import BlockWriteResultHandler
from blockx_server.pipeline.writers.iceberg_write import IcebergWriteResultHandler
from blockx_server.pipeline.writers.return_value import ReturnValueResultHandler
from blockx_server.pipeline.writers.table_upserts import TableUpsertsResultHandler

_KIND = "Writer Plugin"


def block_writers() -> Writers:
    writers = Writers(
        _KIND,
        cluster="block",
        elsewhere={"BlockBundleWriteResultHandler": "bundle"},
    )
    # The Runtime page spells it ReturnValueHandler.
    writers.register(
        "ReturnValueResultHandler", ReturnValueResultHandler(), aliases=["ReturnValueHandler"]
    )
    writers.register(
        "BlockWriteResultHandler", BlockWriteResultHandler(), aliases=["BlockTableWriteHandler"]
    )
    writers.register(
        "TableUpsertsResultHandler",
        TableUpsertsResultHandler(),
        aliases=["NormalTableWriteHandler"],
    )
    writers.register(
        "IcebergWriteResultHandler",
        IcebergWriteResultHandler(),
        aliases=["IcebergTableWriteHandler"],
    )
    return writers


def bundle_writers() -> Writers:
    writers = Writers(
        _KIND,
        cluster="bundle",
        elsewhere={
            "ReturnValueResultHandler": "block",
            "ReturnValueHandler": "block",
            "BlockWriteResultHandler": "block",
        },
    )
    writers.register(
        "BlockBundleWriteResultHandler",
        BlockBundleWriteResultHandler(),
        aliases=["BlockTableWriteHandler"],
    )
    writers.register(
        "TableUpsertsResultHandler",
        TableUpsertsResultHandler(),
        aliases=["NormalTableWriteHandler"],
    )
    writers.register(
        "IcebergWriteResultHandler",
        IcebergWriteResultHandler(),
        aliases=["IcebergTableWriteHandler"],
    )
    return writers


def writers_for(deployment: RegistryKind) -> Writers:
    """The Writer Plugins of the block or the bundle Worker."""
    return bundle_writers() if deployment is RegistryKind.BUNDLE else block_writers()


__all__ = [
    "PluginError",
    "WriterPlugin",
    "Writers",
    "block_writers",
    "bundle_writers",
    "failed_writer_result",
    "writers_for",
]
