"""Which Call Builders and Writer Plugins each cluster's Worker has, and what a
Worker says of a name the other cluster serves."""

from __future__ import annotations

from blockx_core.registry import RegistryKind
from blockx_server.pipeline.builders import block_builders, builders_for, bundle_builders
from blockx_server.pipeline.writers import block_writers, bundle_writers, writers_for


def test_the_block_cluster_has_every_builder_and_return_value() -> None:
    assert block_builders().names() == [
        "BlockBundleCallConfig",
        "BlockTableCallConfig",
        "CallListCallConfig",
        "InputsCallConfig",
    ]
    writers = block_writers()
    assert writers.get("ReturnValueHandler") is writers.get("ReturnValueResultHandler") is not None


def test_the_bundle_cluster_has_bundle_and_inputs_and_no_return_value() -> None:
    assert bundle_builders().names() == ["BlockBundleCallConfig", "InputsCallConfig"]
    writers = bundle_writers()
    assert writers.get("ReturnValueResultHandler") is None
    assert writers.get("ReturnValueHandler") is None


def test_the_profile_picks_the_set() -> None:
    assert builders_for(RegistryKind.BUNDLE).cluster == "bundle"
    assert builders_for(RegistryKind.BLOCK).cluster == "block"
    assert writers_for(RegistryKind.BUNDLE).cluster == "bundle"
    assert writers_for(RegistryKind.BLOCK).cluster == "block"


def test_a_missing_name_names_the_cluster_that_has_it() -> None:
    assert bundle_builders().missing("CallListCallConfig") == (
        "no Call Builder 'CallListCallConfig' on the bundle worker (known: "
        "BlockBundleCallConfig, InputsCallConfig); CallListCallConfig runs on the block "
        "cluster: submit the task there"
    )
    assert "BlockTableCallConfig runs on the block cluster" in bundle_builders().missing(
        "BlockTableCallConfig"
    )
    for name in ("ReturnValueResultHandler", "ReturnValueHandler", "BlockWriteResultHandler"):
        assert f"{name} runs on the block cluster" in bundle_writers().missing(name)
    assert "runs on the bundle cluster" in block_writers().missing("BlockBundleWriteResultHandler")
    # A name no cluster has gets no hint.
    assert block_builders().missing("Nope") == (
        "no Call Builder 'Nope' on the block worker (known: BlockBundleCallConfig, "
        "BlockTableCallConfig, CallListCallConfig, InputsCallConfig)"
    )
