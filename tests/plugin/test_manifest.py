"""The npe2 manifest is valid, installed with the package, and its sample data loads offline."""

import numpy as np
import pytest

npe2 = pytest.importorskip("npe2")


def test_manifest_is_registered_under_the_plugin_name():
    manifest = npe2.PluginManifest.from_distribution("triton-sam")
    assert manifest.name == "triton-sam"
    assert {s.key for s in manifest.contributions.sample_data} == {"coins", "coins_stack"}
    assert [w.display_name for w in manifest.contributions.widgets] == ["Segment Anything"]


@pytest.mark.parametrize("key, ndim", [("coins", 2), ("coins_stack", 3)])
def test_sample_data_commands_return_image_layers(key, ndim):
    manifest = npe2.PluginManifest.from_distribution("triton-sam")
    sample = next(s for s in manifest.contributions.sample_data if s.key == key)
    command = next(c for c in manifest.contributions.commands if c.id == sample.command)
    module, _, name = command.python_name.partition(":")
    ((data, meta, layer_type),) = getattr(__import__(module, fromlist=[name]), name)()
    assert layer_type == "image" and data.ndim == ndim and data.dtype == np.uint8 and meta["name"]
