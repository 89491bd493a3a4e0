"""The Call Builders of each cluster: one module each, one registration line each.

| block Worker | BlockTableCallConfig, BlockBundleCallConfig, InputsCallConfig,
|              | CallListCallConfig
| bundle Worker | BlockBundleCallConfig, InputsCallConfig

A name the Worker lacks fails BUILDER_NOT_FOUND, naming the cluster that has it.
BlockBundleCallConfig is also a StreamingCallBuilder: with STREAM_BUILD_ENABLED
(default on on the bundle Worker, off on the block Worker) its scan runs inside the
Calls phase.

Every Builder is bounded by TASK_MAX_CALLS calls per task: the listed ones
(CallListCallConfig, InputsCallConfig; ``listed.py``) count while they parse, on a
thread, before building anything; a streamed scan counts as it feeds; the chain
Builders' eager build is checked once built.
"""

from blockx_core.registry import RegistryKind
from blockx_server.pipeline.builders.base import (
    Builders,
    CallBuilder,
    CallList,
)
from blockx_server.pipeline.builders.block_bundle import BlockBundleCallConfig
from blockx_server.pipeline.builders.block_table import BlockTableCallConfig
from blockx_server.pipeline.builders.call_list import CallListCallConfig
from blockx_server.pipeline.builders.inputs import InputsCallConfig
from blockx_server.pipeline.builders.listed import (
    DEFAULT_TASK_MAX_CALLS,
    ListedCallBuilder,
    check_call_count,
    count_listed,
)
from blockx_server.pipeline.builders.streaming import (
    CallStream,
    StreamBuildConfig,
    StreamingCallBuilder,
    feed_calls,
)
from blockx_server.pipeline.plugins import PluginError

_KIND = "Call Builder"


def block_builders() -> Builders:
    builders = Builders(_KIND, cluster="block")
    builders.register("BlockTableCallConfig", BlockTableCallConfig())
    builders.register("BlockBundleCallConfig", BlockBundleCallConfig())
    builders.register("InputsCallConfig", InputsCallConfig())
    builders.register("CallListCallConfig", CallListCallConfig())
    return builders


def bundle_builders() -> Builders:
    builders = Builders(
        _KIND,
        cluster="bundle",
        elsewhere={"BlockTableCallConfig": "block", "CallListCallConfig": "block"},
    )
    builders.register("BlockBundleCallConfig", BlockBundleCallConfig())
    builders.register("InputsCallConfig", InputsCallConfig())
    return builders


def builders_for(deployment: RegistryKind) -> Builders:
    """The Call Builders of the block or the bundle Worker."""
    return bundle_builders() if deployment is RegistryKind.BUNDLE else block_builders()


__all__ = [
    "DEFAULT_TASK_MAX_CALLS",
    "Builders",
    "CallBuilder",
    "CallList",
    "CallStream",
    "ListedCallBuilder",
    "PluginError",
    "StreamBuildConfig",
    "StreamingCallBuilder",
    "block_builders",
    "builders_for",
    "bundle_builders",
    "check_call_count",
    "count_listed",
    "feed_calls",
]
