"""Layer adapters: plane indices, coordinates, and writing objects without losing annotations."""

import subprocess
import sys

import numpy as np
import pytest

napari = pytest.importorskip("napari")
from napari.layers import Image, Labels  # noqa: E402

from triton_sam.plugin import layers  # noqa: E402
from triton_sam.plugin import preview as previews  # noqa: E402


def test_plane_index_and_pixel_coordinates_follow_scale_and_translate():
    image = Image(np.zeros((4, 30, 50)), scale=(2.0, 0.5, 3.0), translate=(1.0, 10.0, -6.0))
    world = image.data_to_world([3, 12, 40])
    assert layers.plane_index(image, world) == (3,)
    assert layers.image_xy(image, world) == pytest.approx((40.0, 12.0))
    assert layers.plane_shape(image) == (30, 50)


def test_rgb_planes_keep_their_colour_axis():
    image = Image(np.zeros((3, 20, 40, 3), np.uint8), rgb=True)
    assert layers.plane_shape(image) == (20, 40)
    assert layers.plane_data(image, (1,)).shape == (20, 40, 3)


def test_the_model_sees_a_grey_layer_with_its_contrast_limits_and_colour_as_it_is():
    grey = Image(np.zeros((20, 40), np.uint16), contrast_limits=(100, 900))
    assert layers.encoding_contrast(grey) == (100.0, 900.0)
    assert layers.encoding_contrast(Image(np.zeros((20, 40, 3), np.uint8), rgb=True)) is None


def test_planes_and_stacks_of_a_zarr_layer_are_read_only_where_they_are_used():
    """napari shows a zarr array as it is; indexing it reads at once (a whole plane for one tile,
    a whole stack for one plane), so the plugin keeps its planes and stacks lazy."""
    from triton_sam.plugin.propagation import stack_data

    zarr = pytest.importorskip("zarr")
    data = np.random.default_rng(0).integers(0, 4000, (2, 5, 40, 60), dtype=np.uint16)
    array = zarr.create_array(store={}, shape=data.shape, chunks=(1, 1, 20, 30), dtype=data.dtype)
    array[:] = data
    image = Image(array)
    plane = layers.plane_data(image, (1, 3))
    assert not isinstance(plane, np.ndarray) and plane.shape == (40, 60)
    np.testing.assert_array_equal(plane[10:30, 20:50], data[1, 3, 10:30, 20:50])
    stack = stack_data(image, (1, 3), axis=1)
    assert not isinstance(stack, np.ndarray) and stack.shape == (5, 40, 60)
    np.testing.assert_array_equal(stack[4], data[1, 4])
    np.testing.assert_array_equal(np.asarray(stack), data[1])


def test_tracked_objects_are_written_together_and_never_over_other_objects():
    """Object 1 moved to where object 2 was: written together, 1 takes 2's old pixels, 2 its new
    ones (one at a time, 1 would not take pixels 2 still held); object 9 is never touched."""
    objects = Labels(np.zeros((2, 6, 8), np.uint16))
    objects.data[1, :, 0:2] = 1
    objects.data[1, :, 2:4] = 2
    objects.data[1, 0, :] = 9
    one, two = np.zeros((6, 8), bool), np.zeros((6, 8), bool)
    one[:, 2:4], two[:, 4:6] = True, True
    before = objects.data.copy()
    written = layers.write_tracked(objects, (1,), {1: one, 2: two})
    expected = np.zeros((6, 8), np.uint16)
    expected[:, 2:4], expected[:, 4:6], expected[0, :] = 1, 2, 9
    np.testing.assert_array_equal(objects.data[1], expected)
    assert written == 5 * 6 and not objects.data[0].any()
    objects.undo()
    np.testing.assert_array_equal(objects.data, before)


def test_a_commit_never_paints_over_existing_labels_and_can_be_undone():
    objects = Labels(np.zeros((2, 10, 10), np.uint32))
    objects.data[1, 0:5, 0:5] = 7  # the user's own annotation
    mask = np.zeros((10, 10), bool)
    mask[2:8, 2:8] = True
    written = layers.write_object(objects, (1,), mask, 8, {"points": [[4.0, 4.0]], "model_id": "m"})
    assert written == 36 - 9
    assert objects.metadata[layers.PROVENANCE_KEY] == {8: {"plane": [1], "points": [[4.0, 4.0]], "model_id": "m"}}
    assert (objects.data[1, 0:5, 0:5] == 7).all() and objects.data[1, 6, 6] == 8
    assert not objects.data[0].any()  # other planes untouched
    objects.undo()
    expected = np.zeros((10, 10), np.uint32)
    expected[0:5, 0:5] = 7
    np.testing.assert_array_equal(objects.data[1], expected)


def test_each_image_gets_its_own_objects_layer_and_the_plugin_layers_sit_above_their_image():
    from napari.components import ViewerModel

    viewer = ViewerModel()
    first = viewer.add_image(np.zeros((10, 12)), name="first")
    second = viewer.add_image(np.zeros((10, 12)), name="second")  # same shape: must not share objects
    layers.preview_layer(viewer, first)
    assert [layer.name for layer in viewer.layers] == ["first", layers.PREVIEW_NAME, "second"]
    objects_first = layers.objects_layer(viewer, first)
    layers.preview_layer(viewer, first)
    assert [layer.name for layer in viewer.layers] == ["first", "first [triton-sam objects]", layers.PREVIEW_NAME, "second"]
    objects_second = layers.objects_layer(viewer, second)
    preview = layers.preview_layer(viewer, second)  # Start on the other image: the preview moves with it
    assert [layer.name for layer in viewer.layers][-3:] == ["second", "second [triton-sam objects]", layers.PREVIEW_NAME]
    assert objects_second is not objects_first and layers.existing_objects_layer(viewer, first) is objects_first
    np.testing.assert_allclose(preview.colormap.map(previews.OUTLINE), previews.OUTLINE_COLOR)


def test_crops_at_offsets_are_written_where_they_belong_and_ids_widen_a_small_label_type():
    objects = Labels(np.zeros((40, 60), np.uint16))
    crop = np.zeros((10, 10), bool)
    crop[2:5, 3:7] = True
    assert layers.write_object(objects, (), crop, 3, {}, offset=(20, 30)) == 12
    assert objects.data[22:25, 33:37].tolist() == [[3] * 4] * 3 and int(objects.data.sum()) == 36
    assert layers.write_object(objects, (), crop, 70000, {}, offset=(0, 0)) == 12  # beyond uint16
    assert objects.data.dtype == np.uint32 and objects.data[3, 4] == 70000 and objects.data[23, 34] == 3


def test_zoomed_out_tiles_are_as_coarse_as_screen_pixels_and_read_from_the_pyramid_levels_that_reduce_the_plane_only():
    from napari.components import ViewerModel

    viewer = ViewerModel()
    plane = np.zeros((3, 4096, 4096), np.uint16)
    image = viewer.add_image(plane, scale=(1.0, 0.5, 0.5))
    assert [layers.screen_step(image, zoom) for zoom in (4.0, 2.0, 1.0, 0.5, 0.24, 0.06)] == [1, 1, 2, 4, 8, 32]
    pyramid = [plane, plane[:, ::2, ::2], plane[:, ::4, ::4], plane[::3, ::8, ::8], plane[:, ::6, ::3]]
    multiscale = viewer.add_image(pyramid, multiscale=True)
    assert multiscale.downsample_factors.tolist()[3] == [3.0, 8.0, 8.0]
    levels = layers.plane_levels(multiscale, (2,))
    assert sorted(levels) == [2, 4] and levels[4].shape == (1024, 1024)  # the z-reduced and uneven levels left out
    assert layers.plane_levels(image, (2,)) == {}


def test_what_napari_imports_for_its_first_labels_layer_is_imported_ahead():
    """Opening the panel imports in the background what napari's first Labels layer imports
    (~0.3 s), so that Start does not wait for it on the GUI thread (skimage.color loads lazily:
    importing it imported nothing)."""
    script = """
import sys
import subprocess
import sys

import numpy as np
from napari.layers import Labels
from triton_sam.plugin import layers
layers.import_for_labels().join()
before = set(sys.modules)
Labels(np.zeros((4, 4), np.uint8))
print(sorted(m for m in set(sys.modules) - before if m.split(".")[0] in ("pandas", "scipy", "skimage")))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert run.stdout.strip() == "[]"


def test_an_image_s_objects_layer_is_found_after_a_rename_while_the_panel_was_stopped():
    """Found by the image layer's identity, then named after it again (a second objects layer was
    made, its ids starting over, and Propagate found none); a new layer taking the old name does
    not take the objects; a saved objects layer opened again is found by its image's name."""
    from napari.components import ViewerModel

    viewer = ViewerModel()
    image = viewer.add_image(np.zeros((30, 40)), name="cells")
    objects = layers.objects_layer(viewer, image)
    image.name = "cells, day 2"  # nothing of ours is listening
    newcomer = viewer.add_image(np.zeros((30, 40)), name="cells")
    assert layers.existing_objects_layer(viewer, newcomer) is None
    assert layers.existing_objects_layer(viewer, image) is objects
    assert objects.name == "cells, day 2 [triton-sam objects]"
    assert layers.objects_layer(viewer, newcomer) is not objects

    saved = {**objects.metadata, layers.IMAGE_ID_KEY: "a layer of another napari session"}
    reopened = viewer.add_image(np.zeros((30, 40)), name="slide")
    opened = viewer.add_labels(np.zeros((30, 40), np.uint32), name="mine", metadata={**saved, layers.IMAGE_KEY: "slide"})
    assert layers.existing_objects_layer(viewer, reopened) is opened and opened.name == "mine"  # the user's name stays


def test_prompt_layers_change_only_when_what_they_show_changes():
    """Each change of a layer's data makes napari recompute the viewer's dims: a commit or click
    must not pay that for a layer that shows nothing before and after."""
    from napari.components import ViewerModel

    from triton_sam.prompts import Prompts

    viewer = ViewerModel()
    image = viewer.add_image(np.zeros((40, 60)))
    points, box = layers.prompt_layers(viewer, image, above=image)
    changes = []
    for layer in (points, box):
        layer.events.data.connect(lambda event, layer=layer: changes.append(layer.name))

    layers.show_prompts(points, box, Prompts())
    assert changes == []
    layers.show_prompts(points, box, Prompts().with_point((10.0, 20.0)))
    assert set(changes) == {layers.PROMPTS_NAME} and points.data.tolist() == [[20.0, 10.0]]
    layers.show_prompts(points, box, Prompts(box=(5.0, 6.0, 30.0, 20.0)))
    assert len(points.data) == 0 and box.nshapes == 1
    changes.clear()
    layers.show_prompts(points, box, Prompts())
    assert set(changes) == {layers.BOX_NAME} and box.nshapes == 0
