"""How the viewer's mouse and keys drive the session: napari bindings as module functions, as
napari's own layer bindings are. Each acts on a widget's session and image, and only while the
widget is interactive (a plane encoded and on screen, the SAM interaction switch on, 2D view).
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import numpy as np

from . import layers

KEYS = {  # checked against napari's own bindings in the tests
    "commit": "Shift-C",
    "discard": "Shift-X",
    "undo": "Shift-U",
    "cycle": "Shift-N",
}
NEGATIVE_MODIFIER = "Alt"  # Alt-click: negative point
BOX_MODIFIER = "Control"  # Ctrl-drag: box
CLICK_TOLERANCE_PX = 3.0  # a press that moves less than this on screen is a click


def camera(viewer):
    """The viewer's camera (`viewer.scene.camera` since napari 0.9, `viewer.camera` before)."""
    return viewer.scene.camera if hasattr(viewer, "scene") else viewer.camera


def hover(widget, viewer, event) -> None:
    """Mouse move: ask for the preview of the object under the cursor."""
    widget.cursor = event.position  # where a plane shown later is previewed without a move
    if widget.interactive():
        widget.session.hover(*layers.image_xy(widget.image, event.position))


def press(widget, viewer, event) -> Generator[None, None, None]:
    """Mouse press: a click adds a point (negative with `NEGATIVE_MODIFIER`), a drag with
    `BOX_MODIFIER` sets a box; any other drag is napari's (pan)."""
    if not widget.interactive() or event.button != 1:
        return
    start = np.asarray(event.position, float)
    box = BOX_MODIFIER in event.modifiers
    if box:
        camera(viewer).mouse_pan = False
    yield
    moved = False
    x0, y0 = layers.image_xy(widget.image, start)
    while event.type == "mouse_move":
        moved = moved or np.abs(np.asarray(event.position) - start).max() * camera(viewer).zoom > CLICK_TOLERANCE_PX
        if box:
            layers.show_box(widget.box, (x0, y0, *layers.image_xy(widget.image, event.position)))
        yield
    if box:
        camera(viewer).mouse_pan = True
        widget.set_box(x0, y0, *layers.image_xy(widget.image, event.position))
    elif not moved:
        x, y = layers.image_xy(widget.image, event.position)
        widget.add_point(x, y, positive=NEGATIVE_MODIFIER not in event.modifiers)


def bind_keys(viewer, actions: dict[str, Callable[[], None]]) -> dict[str, Callable]:
    """Bind `KEYS` to `actions` (by name); returns the bound callables for `unbind_keys`."""
    bound = {}
    for name, key in KEYS.items():
        bound[key] = lambda viewer, action=actions[name]: action()
        viewer.bind_key(key, bound[key], overwrite=True)
    return bound


def unbind_keys(viewer, bound: dict[str, Callable]) -> None:
    """Undo `bind_keys`; a key another panel bound since is given back to it."""
    for key, action in bound.items():
        previous = viewer.bind_key(key, None)
        if previous is not action:
            viewer.bind_key(key, previous)
