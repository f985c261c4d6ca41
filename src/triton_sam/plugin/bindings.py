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

KEYS = {  # the default keys ("triton-sam" in `keys.PRESETS`); checked against napari's own in the tests
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
    """Mouse press: a click adds a point (negative with `NEGATIVE_MODIFIER`, or without it while
    `target.negative_points` is on), a drag with `BOX_MODIFIER` sets a box (with `NEGATIVE_MODIFIER`
    too: a negative one, which only Find's exemplars have); any other drag is napari's (pan)."""
    if event.button != 1 or not target.acts():
        return
    start = np.asarray(event.position, float)
    box, negative_box = BOX_MODIFIER in event.modifiers, NEGATIVE_MODIFIER in event.modifiers
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
        target.set_box(x0, y0, *layers.image_xy(target.image, event.position), positive=not negative_box)
    elif not moved:
        x, y = layers.image_xy(target.image, event.position)
        target.add_point(x, y, positive=(NEGATIVE_MODIFIER in event.modifiers) == target.negative_points)


def bind_keys(provider, actions: dict[str, Callable]) -> dict[str, tuple[Callable, Callable | None]]:
    """Bind each key of `actions` on `provider` (the viewer, or a layer: napari's `bind_key`), over
    what it had there; returns what `unbind_keys` needs to give that back."""
    bound = {}
    for key, action in actions.items():
        bound[key] = (action, provider.bind_key(key, action, overwrite=True))
    return bound


def unbind_keys(provider, bound: dict[str, tuple[Callable, Callable | None]]) -> None:
    """Undo `bind_keys`: each key goes back to what `provider` had before; a key another panel
    bound since stays theirs."""
    for key, (action, before) in bound.items():
        now = provider.bind_key(key, None)
        if now is not action:
            provider.bind_key(key, now)
        elif before is not None:
            provider.bind_key(key, before)
