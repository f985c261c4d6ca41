"""Adapters between napari layers and the session: planes, coordinates, preview and output layers.

Public napari API only. A plane is the 2D image on screen: the layer's last two data axes (before
an RGB axis), at the indices the viewer's sliders point to.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
from napari.layers import Image, Labels
from napari.utils.colormaps import DirectLabelColormap

PREVIEW_NAME = "triton-sam preview"
PREVIEW_COLOR = (1.0, 0.85, 0.0, 1.0)  # one fixed colour; committed objects get napari's random label colours
OBJECTS_SUFFIX = " [triton-sam objects]"
IMAGE_KEY = "triton_sam_image"  # in an objects layer's metadata: the image layer it belongs to
PROVENANCE_KEY = "triton_sam_objects"  # in the objects layer's metadata: how each object was made


def plane_index(layer: Image, world_point) -> tuple[int, ...]:
    """Data indices of the non-displayed axes (all but the last two) at a world point."""
    data = layer.world_to_data(world_point)
    shape = layer.data.shape[: layer.ndim]
    return tuple(int(np.clip(round(c), 0, n - 1)) for c, n in zip(data[:-2], shape[:-2]))


def plane_key(layer: Image, index: tuple[int, ...]) -> Hashable:
    """Identifies a plane of a layer for the session (features themselves are keyed by content)."""
    return (id(layer), index)


def plane_data(layer: Image, index: tuple[int, ...]) -> np.ndarray:
    """The plane as an array: (Y, X) or (Y, X, C) for RGB(A)."""
    return np.asarray(layer.data[index])


def image_xy(layer: Image, world_point) -> tuple[float, float]:
    """(x, y) in the layer's data pixels (pixel centres at integers) of a world point."""
    data = layer.world_to_data(world_point)
    return float(data[-1]), float(data[-2])


def plane_shape(layer: Image) -> tuple[int, int]:
    return tuple(layer.data.shape[layer.ndim - 2 : layer.ndim])


def place_above(viewer, image: Image, layer) -> None:
    """Move `layer` directly above `image` in the layer list (drawn over it)."""
    viewer.layers.move(viewer.layers.index(layer), viewer.layers.index(image) + 1)  # indices before the move


def preview_layer(viewer, image: Image) -> Labels:
    """A 2D Labels layer over the image's plane for the live preview (updated in place), directly
    above the image (and its objects), in `PREVIEW_COLOR`."""
    shape = plane_shape(image)
    preview = next(
        (
            layer
            for layer in viewer.layers
            if layer.name == PREVIEW_NAME and isinstance(layer, Labels) and layer.data.shape == shape
        ),
        None,
    )
    if preview is None:
        if PREVIEW_NAME in viewer.layers:
            viewer.layers.remove(PREVIEW_NAME)
        preview = viewer.add_labels(
            np.zeros(shape, np.uint8), name=PREVIEW_NAME, scale=image.scale[-2:], translate=image.translate[-2:], opacity=0.5
        )
        preview.colormap = DirectLabelColormap(color_dict={None: (0.0, 0.0, 0.0, 0.0), 1: PREVIEW_COLOR})
    else:
        preview.scale, preview.translate = image.scale[-2:], image.translate[-2:]
    objects = existing_objects_layer(viewer, image)
    place_above(viewer, objects if objects is not None else image, preview)
    return preview


def objects_name(image: Image) -> str:
    return f"{image.name}{OBJECTS_SUFFIX}"


def existing_objects_layer(viewer, image: Image) -> Labels | None:
    """The output Labels layer of `image` (one per image layer), if there is one already."""
    shape = image.data.shape[: image.ndim]
    for layer in viewer.layers:
        if isinstance(layer, Labels) and layer.metadata.get(IMAGE_KEY) == image.name and layer.data.shape == shape:
            return layer
    return None


def objects_layer(viewer, image: Image) -> Labels:
    """The output Labels layer for `image`'s committed objects (same shape as its data axes),
    made directly above it at the first commit."""
    existing = existing_objects_layer(viewer, image)
    if existing is not None:
        return existing
    objects = viewer.add_labels(
        np.zeros(image.data.shape[: image.ndim], np.uint32),
        name=objects_name(image),
        scale=image.scale,
        translate=image.translate,
        metadata={IMAGE_KEY: image.name},
    )
    place_above(viewer, image, objects)
    return objects


def show_preview(layer: Labels, mask: np.ndarray | None) -> None:
    """Replace the preview in place (no undo history: it is not an annotation)."""
    layer.data[...] = 0 if mask is None else mask
    layer.refresh()


def write_object(layer: Labels, index: tuple[int, ...], mask: np.ndarray, object_id: int, provenance: dict) -> int:
    """Paint `object_id` where `mask` is set and nothing is labelled yet, through the undoable API,
    and keep how it was made in the layer's metadata (`PROVENANCE_KEY`: id -> plane index and
    `provenance`), which napari saves with the layer.

    Returns the number of pixels written; existing labels are never overwritten.
    """
    plane = np.asarray(layer.data[index])
    ys, xs = np.nonzero(mask & (plane == 0))
    if ys.size:
        indices = tuple(np.full(ys.size, i) for i in index) + (ys, xs)
        layer.data_setitem(indices, object_id)
        objects = layer.metadata.setdefault(PROVENANCE_KEY, {})
        objects[int(object_id)] = {"plane": list(index), **provenance}
    return int(ys.size)
