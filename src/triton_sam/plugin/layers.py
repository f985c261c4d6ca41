"""Adapters between napari layers and the session: planes, coordinates, preview and output layers
(how the preview is drawn and written: `preview`).

Public napari API only. A plane is the 2D image on screen: the layer's last two data axes (before
an RGB axis), at the indices the viewer's sliders point to.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Hashable, Mapping

import numpy as np
from napari.layers import Image, Labels, Points, Shapes

from ..image import ContrastLimits, lazy_index
from ..session import Offset
from . import preview as previews

PREVIEW_NAME = "triton-sam preview"
PROMPTS_NAME = "triton-sam prompts"
BOX_NAME = "triton-sam box"
FOUND_NAME = "triton-sam found"
FOUND_OPACITY = 0.6
POSITIVE_COLOR = "#33e633"
NEGATIVE_COLOR = "#ff3333"
OBJECTS_SUFFIX = " [triton-sam objects]"
# What napari imports when it makes its first Labels layer (~0.3 s): its features table, label colours.
LABELS_IMPORTS = ("pandas", "skimage.color.colorconv")  # skimage.color loads its modules lazily
IMAGE_KEY = "triton_sam_image"  # in an objects layer's metadata: the image layer it belongs to
IMAGE_ID_KEY = "triton_sam_image_id"  # and that layer's `unique_id` (in this napari session)
PROVENANCE_KEY = "triton_sam_objects"  # in the objects layer's metadata: how each object was made


def import_for_labels() -> threading.Thread:
    """Import `LABELS_IMPORTS` on a background thread, so that making the plugin's first layers at
    Start does not wait for them on the GUI thread. Only a head start: napari imports them itself."""

    def run() -> None:
        for name in LABELS_IMPORTS:
            try:
                importlib.import_module(name)
            except ImportError:
                pass

    thread = threading.Thread(target=run, name="triton-sam imports", daemon=True)
    thread.start()
    return thread


def plane_index(layer: Image, world_point) -> tuple[int, ...]:
    """Data indices of the non-displayed axes (all but the last two) at a world point."""
    data = layer.world_to_data(world_point)
    shape = layer.data.shape[: layer.ndim]
    return tuple(int(np.clip(round(c), 0, n - 1)) for c, n in zip(data[:-2], shape[:-2]))


def plane_key(layer: Image, index: tuple[int, ...]) -> Hashable:
    """Identifies a plane of a layer for the session (features themselves are keyed by content)."""
    return (id(layer), index)


def of_layer(layer: Image, key: Hashable) -> bool:
    """Whether `key` (a `plane_key`) is of a plane of `layer`."""
    return isinstance(key, tuple) and key[:1] == (id(layer),)


def plane_data(layer: Image, index: tuple[int, ...]):
    """The plane, (Y, X) or (Y, X, C) for RGB(A), at full resolution (a multiscale layer's level 0),
    as the layer holds it: a dask or zarr plane is read only where the session reads it."""
    data = layer.data[0] if layer.multiscale else layer.data
    return lazy_index(data, index)


def _plane_factor(layer: Image, level: int) -> int | None:
    """The integer factor by which a multiscale level reduces the plane, or None when it also
    reduces the other axes or reduces rows and columns differently."""
    *lead, fy, fx = np.asarray(layer.downsample_factors[level])[: layer.ndim]
    return int(fy) if np.all(np.asarray(lead) == 1) and fy == fx and float(fy).is_integer() else None


def plane_levels(layer: Image, index: tuple[int, ...]) -> dict[int, object]:
    """A multiscale layer's coarser levels of the plane, by their downsampling factor (see `_plane_factor`)."""
    if not layer.multiscale:
        return {}
    factors = {level: _plane_factor(layer, level) for level in range(1, len(layer.data))}
    return {factor: lazy_index(layer.data[level], index) for level, factor in factors.items() if factor and factor > 1}


def screen_step(layer: Image, zoom: float) -> int:
    """Plane pixels a side of one screen pixel at the camera's `zoom`, rounded down to a power of
    two (at least 1): how much coarser than native the tiles of a large plane can be."""
    per_screen_pixel = 1.0 / (zoom * float(layer.scale[-1]))
    return 2 ** int(np.floor(np.log2(max(per_screen_pixel, 1.0)) + 1e-9))


def visible_region(layer: Image) -> tuple[int, int, int, int]:
    """Rows y0:y1 and columns x0:x1 of the plane (full-resolution pixels) that the canvas shows."""
    corners = np.asarray(layer.corner_pixels, float)[:, -2:]
    if layer.multiscale:  # corner pixels are in the level drawn
        corners = corners * np.asarray(layer.downsample_factors[layer.data_level])[-2:]
    (y0, x0), (y1, x1) = np.floor(corners[0]).astype(int), np.ceil(corners[1]).astype(int)
    return int(y0), int(x0), int(y1), int(x1)


def image_xy(layer: Image, world_point) -> tuple[float, float]:
    """(x, y) in the layer's data pixels (pixel centres at integers) of a world point."""
    data = layer.world_to_data(world_point)
    return float(data[-1]), float(data[-2])


def encoding_contrast(layer: Image) -> ContrastLimits | None:
    """The layer's contrast as the model sees it: its planes are scaled to uint8 from the contrast
    limits the user sees them with; None for RGB(A), which SAM sees as it is."""
    return None if layer.rgb else tuple(float(c) for c in layer.contrast_limits)


def plane_shape(layer: Image) -> tuple[int, int]:
    return tuple(layer.data.shape[layer.ndim - 2 : layer.ndim])


def place_above(viewer, image: Image, layer) -> None:
    """Move `layer` directly above `image` in the layer list (drawn over it)."""
    viewer.layers.move(viewer.layers.index(layer), viewer.layers.index(image) + 1)  # indices before the move


def _reusable(viewer, name: str, kind: type, fits=lambda layer: True):
    """Our layer called `name` if it is a `kind` that `fits`; a layer of that name that is not is removed."""
    found = next((layer for layer in viewer.layers if layer.name == name and isinstance(layer, kind) and fits(layer)), None)
    if found is None and name in viewer.layers:
        viewer.layers.remove(name)
    return found


def _on_plane(image: Image) -> dict:
    """The placement of the image's plane, for a 2D layer (given when it is made: a layer placed
    elsewhere first would change the viewer's extent)."""
    return {"scale": image.scale[-2:], "translate": image.translate[-2:]}


def preview_layer(viewer, image: Image, window: bool = False) -> Labels:
    """A 2D Labels layer over the image's plane for the live preview, directly above the image (and
    its objects), in `preview`'s outlines. As large as the plane and updated in place, or with
    `window` a small one that `preview.WindowPreview` moves (large planes)."""
    shape = (previews.PREVIEW_WINDOW,) * 2 if window else plane_shape(image)
    preview = _reusable(viewer, PREVIEW_NAME, Labels, lambda layer: layer.data.shape == shape)
    if preview is None:
        preview = viewer.add_labels(np.zeros(shape, np.uint8), name=PREVIEW_NAME, opacity=1.0, **_on_plane(image))
        preview.colormap = previews.colormap()
    else:
        preview.scale, preview.translate = _on_plane(image).values()
    objects = existing_objects_layer(viewer, image)
    place_above(viewer, objects if objects is not None else image, preview)
    return preview


def found_layer(viewer, image: Image, shape: tuple[int, int]) -> Labels:
    """The 2D Labels layer that shows what Find found on the image's plane (`shape`), each instance
    in its own of napari's label colours, directly above the image and its objects."""
    found = _reusable(viewer, FOUND_NAME, Labels, lambda layer: layer.data.shape == shape)
    if found is None:
        found = viewer.add_labels(np.zeros(shape, np.uint16), name=FOUND_NAME, opacity=FOUND_OPACITY, **_on_plane(image))
    else:
        found.scale, found.translate = _on_plane(image).values()
    objects = existing_objects_layer(viewer, image)
    place_above(viewer, objects if objects is not None else image, found)
    return found


def prompt_layers(viewer, image: Image, above: Labels) -> tuple[Points, Shapes]:
    """The layers that draw the object's prompts over the image's plane, directly above `above`:
    points (`POSITIVE_COLOR` / `NEGATIVE_COLOR`) and, above them, the box (a rectangle; a Shapes
    layer under a Points layer segfaults napari 0.9 when the image and then it are deleted).
    Drawn, not edited: the session holds the prompts."""
    size = max(plane_shape(image)) / 100  # data pixels; kept between 7 and 14 screen pixels
    points = _reusable(viewer, PROMPTS_NAME, Points)
    if points is None:
        points = viewer.add_points(
            np.empty((0, 2)), name=PROMPTS_NAME, size=size, border_color="white", border_width=0.15, **_on_plane(image)
        )
        points.canvas_size_limits = (7, 14)
    box = _reusable(viewer, BOX_NAME, Shapes)
    if box is None:
        box = viewer.add_shapes(
            ndim=2,
            name=BOX_NAME,
            edge_color=POSITIVE_COLOR,
            face_color="transparent",
            edge_width=max(1.0, size / 4),
            **_on_plane(image),
        )
    for layer in (points, box):  # the box above the points: napari 0.9 / vispy 0.17 crash the other way
        layer.scale, layer.translate = _on_plane(image).values()
        place_above(viewer, above, layer)
        above = layer
    return points, box


def show_prompts(points: Points, box_layer: Shapes, prompts) -> None:
    """Draw `prompts` (`session.ObjectInProgress`: points (x, y), labels, box x0, y0, x1, y1). A
    layer that shows none and is to show none is left alone: napari recomputes the viewer's dims
    at each change of a layer's data (~20 ms a layer on 2 cores, at every click and commit)."""
    yx = np.array([(y, x) for x, y in prompts.points], float).reshape(-1, 2)
    if len(yx) or len(points.data):
        points.data = yx
    if len(yx):
        points.face_color = [POSITIVE_COLOR if label else NEGATIVE_COLOR for label in prompts.labels]
    show_box(box_layer, prompts.box)


def show_box(box_layer: Shapes, box: tuple[float, float, float, float] | None) -> None:
    """Draw `box` (x0, y0, x1, y1 in image pixels) as the one rectangle of `box_layer`, or none
    (left alone if it has none: see `show_prompts`)."""
    if box is None and box_layer.nshapes == 0:
        return
    box_layer.data = []
    if box is not None:
        x0, y0, x1, y1 = box
        box_layer.add_rectangles(np.array([[y0, x0], [y1, x1]], float))


def objects_name(image: Image) -> str:
    return f"{image.name}{OBJECTS_SUFFIX}"


def existing_objects_layer(viewer, image: Image) -> Labels | None:
    """The output Labels layer of `image` (one per image layer), if there is one already: made for
    this layer in this napari session (found even if the image was renamed since, and then named
    after it again), or for a layer of its name (saved and opened again)."""
    return _objects_layer_of(viewer, image, image.name)


def rename_objects_layer(viewer, old_name: str, image: Image) -> None:
    """`image` was called `old_name`: its objects layer goes with it (named after it, unless the
    user named it otherwise)."""
    _objects_layer_of(viewer, image, old_name)


def _objects_layer_of(viewer, image: Image, name: str) -> Labels | None:
    """The objects layer made for `image`, or else for a layer called `name` that is not another
    image layer of the viewer (renamed since), claimed for `image`."""
    shape = image.data.shape[: image.ndim]
    ours = [layer for layer in viewer.layers if isinstance(layer, Labels) and layer.data.shape == shape]
    others = {str(layer.unique_id) for layer in viewer.layers if layer is not image}
    found = next((layer for layer in ours if layer.metadata.get(IMAGE_ID_KEY) == str(image.unique_id)), None)
    found = found or next(
        (layer for layer in ours if layer.metadata.get(IMAGE_KEY) == name and layer.metadata.get(IMAGE_ID_KEY) not in others),
        None,
    )
    if found is not None:
        old_name = found.metadata.get(IMAGE_KEY)
        found.metadata.update({IMAGE_KEY: image.name, IMAGE_ID_KEY: str(image.unique_id)})
        if old_name != image.name and found.name == f"{old_name}{OBJECTS_SUFFIX}":
            found.name = objects_name(image)
    return found


def next_object_id(viewer, image: Image) -> int:
    """The id a new object of `image` takes: after the largest in its objects layer (made at the first commit)."""
    existing = existing_objects_layer(viewer, image)
    return int(np.max(existing.data)) + 1 if existing is not None else 1


def objects_layer(viewer, image: Image, dtype: type = np.uint32) -> Labels:
    """The output Labels layer for `image`'s committed objects (same shape as its data axes),
    made directly above it at the first commit. Large planes take uint16 (napari colours uint8
    and uint16 labels on the GPU, larger ones on the CPU: seconds a write at 20000 x 20000);
    `write_object` widens it when the ids outgrow it."""
    existing = existing_objects_layer(viewer, image)
    if existing is not None:
        return existing
    objects = viewer.add_labels(
        np.zeros(image.data.shape[: image.ndim], dtype),
        name=objects_name(image),
        scale=image.scale,
        translate=image.translate,
        metadata={IMAGE_KEY: image.name, IMAGE_ID_KEY: str(image.unique_id)},
    )
    place_above(viewer, image, objects)
    return objects


def unlabelled(layer: Labels, index: tuple[int, ...], mask: np.ndarray, offset: Offset = (0, 0)) -> tuple[np.ndarray, np.ndarray]:
    """Rows and columns (in `mask`) of the pixels of `mask`, placed at `offset` on plane `index`,
    that `layer` has no label at yet."""
    (y, x), (h, w) = offset, mask.shape
    region = np.asarray(layer.data[(*index, slice(y, y + h), slice(x, x + w))])
    return np.nonzero(mask & (region == 0))


def write_object(
    layer: Labels, index: tuple[int, ...], mask: np.ndarray, object_id: int, provenance: dict, offset: Offset = (0, 0)
) -> int:
    """Paint `object_id` where `mask` (placed at `offset` on the plane) is set and nothing is
    labelled yet, through the undoable API, and keep how it was made in the layer's metadata
    (`PROVENANCE_KEY`: id -> plane index and `provenance`), which napari saves with the layer.

    Returns the number of pixels written; existing labels are never overwritten.
    """
    if object_id > np.iinfo(layer.data.dtype).max:
        layer.data = layer.data.astype(np.uint32)  # ids outgrew the layer's type (see `objects_layer`)
    ys, xs = unlabelled(layer, index, mask, offset)
    y, x = offset
    if ys.size:
        indices = tuple(np.full(ys.size, i) for i in index) + (ys + y, xs + x)
        layer.data_setitem(indices, object_id)
        objects = layer.metadata.setdefault(PROVENANCE_KEY, {})
        objects[int(object_id)] = {"plane": list(index), **provenance}
    return int(ys.size)


def write_tracked(layer: Labels, index: tuple[int, ...], masks: Mapping[int, np.ndarray]) -> int:
    """Make each object of `masks` (id -> bool mask) on plane `index` be its mask, through the
    undoable API: their pixels outside their masks are cleared and their masks take the pixels
    that are unlabelled or theirs (the first mask a pixel where they overlap); other objects'
    pixels are never touched. Returns the number of pixels changed."""
    region = np.asarray(layer.data[index])
    written = np.where(np.isin(region, list(masks)), 0, region)
    for object_id, mask in masks.items():
        written[mask & (written == 0)] = object_id
    ys, xs = np.nonzero(written != region)
    if ys.size:
        indices = tuple(np.full(ys.size, i) for i in index) + (ys, xs)
        layer.data_setitem(indices, written[ys, xs])
    return int(ys.size)


def write_labels(layer: Labels, index: tuple[int, ...], labels: np.ndarray, origin: Offset, record: dict) -> int:
    """Add the objects of `labels` (ids 1..n over a region at `origin`, (y, x), of plane `index`) to
    `layer` as new objects, through the undoable API: on the pixels it has no label at, with ids after
    its largest, each with `record` as how it was made. Returns how many objects were added."""
    (y, x), (h, w) = origin, labels.shape
    region = np.asarray(layer.data[(*index, slice(y, y + h), slice(x, x + w))])
    ys, xs = np.nonzero((labels > 0) & (region == 0))
    if not ys.size:
        return 0
    found, order = np.unique(labels[ys, xs], return_inverse=True)
    first = int(np.max(layer.data)) + 1
    if first + found.size - 1 > np.iinfo(layer.data.dtype).max:
        layer.data = layer.data.astype(np.uint32)
    layer.data_setitem(tuple(np.full(ys.size, i) for i in index) + (ys + y, xs + x), (order + first).astype(layer.data.dtype))
    objects = layer.metadata.setdefault(PROVENANCE_KEY, {})
    for object_id in range(first, first + found.size):
        objects[object_id] = {"plane": list(index), **record}
    return int(found.size)
