"""Adapters between napari layers and the session: planes, coordinates, preview and output layers.

Public napari API only. A plane is the 2D image on screen: the layer's last two data axes (before
an RGB axis), at the indices the viewer's sliders point to.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
from napari.layers import Image, Labels

PREVIEW_NAME = "triton-sam preview"
OBJECTS_NAME = "triton-sam objects"
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


def preview_layer(viewer, image: Image) -> Labels:
    """A 2D Labels layer over the image's plane for the live preview (updated in place)."""
    shape = plane_shape(image)
    for layer in viewer.layers:
        if layer.name == PREVIEW_NAME and isinstance(layer, Labels) and layer.data.shape == shape:
            layer.scale, layer.translate = image.scale[-2:], image.translate[-2:]
            return layer
    if PREVIEW_NAME in viewer.layers:
        viewer.layers.remove(PREVIEW_NAME)
    return viewer.add_labels(
        np.zeros(shape, np.uint8),
        name=PREVIEW_NAME,
        scale=image.scale[-2:],
        translate=image.translate[-2:],
        opacity=0.5,
    )


def existing_objects_layer(viewer, image: Image) -> Labels | None:
    """The output Labels layer for `image`, if there is one already."""
    shape = image.data.shape[: image.ndim]
    for layer in viewer.layers:
        if layer.name == OBJECTS_NAME and isinstance(layer, Labels) and layer.data.shape == shape:
            return layer
    return None


def objects_layer(viewer, image: Image) -> Labels:
    """The output Labels layer for committed objects (same shape as the image's data axes)."""
    shape = image.data.shape[: image.ndim]
    existing = existing_objects_layer(viewer, image)
    if existing is not None:
        return existing
    return viewer.add_labels(np.zeros(shape, np.uint32), name=OBJECTS_NAME, scale=image.scale, translate=image.translate)


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
