"""How the viewer's mouse and keys drive the session: napari bindings as module functions, as
napari's own layer bindings are. Each acts on one `interaction.Interaction` alone (as napari's act
on a layer), and only while it is interactive (a plane encoded and on screen, the SAM interaction
switch on, 2D view).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING

import numpy as np

from . import layers

if TYPE_CHECKING:
    from .interaction import Interaction

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


def hover(target: Interaction, viewer, event) -> None:
    """Mouse move: ask for the preview of the object under the cursor."""
    target.cursor = event.position  # where a plane shown later is previewed without a move
    if target.interactive():
        target.hover(*layers.image_xy(target.image, event.position))


def press(target: Interaction, viewer, event) -> Generator[None, None, None]:
    """Mouse press: a click adds a point (negative with `NEGATIVE_MODIFIER`), a drag with
    `BOX_MODIFIER` sets a box; any other drag is napari's (pan)."""
    if event.button != 1 or not target.acts():
        return
    start = np.asarray(event.position, float)
    box = BOX_MODIFIER in event.modifiers
    if box:
        camera(viewer).mouse_pan = False
    yield
    moved = False
    x0, y0 = layers.image_xy(target.image, start)
    while event.type == "mouse_move":
        moved = moved or np.abs(np.asarray(event.position) - start).max() * camera(viewer).zoom > CLICK_TOLERANCE_PX
        if box:
            target.show_box((x0, y0, *layers.image_xy(target.image, event.position)))
        yield
    if box:
        camera(viewer).mouse_pan = True
        target.set_box(x0, y0, *layers.image_xy(target.image, event.position))
    elif not moved:
        x, y = layers.image_xy(target.image, event.position)
        target.add_point(x, y, positive=NEGATIVE_MODIFIER not in event.modifiers)


def bind_keys(viewer, target: Interaction) -> dict[str, Callable]:
    """Bind `KEYS` to the methods of `target` of their names (commit, discard, undo, cycle);
    returns the bound callables for `unbind_keys`."""
    bound = {}
    for name, key in KEYS.items():
        action = getattr(target, name)
        bound[key] = lambda viewer, action=action: action()
        viewer.bind_key(key, bound[key], overwrite=True)
    return bound


def unbind_keys(viewer, bound: dict[str, Callable]) -> None:
    """Undo `bind_keys`; a key another panel bound since is given back to it."""
    for key, action in bound.items():
        previous = viewer.bind_key(key, None)
        if previous is not action:
            viewer.bind_key(key, previous)
