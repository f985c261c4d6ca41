"""Mouse bindings act on their target alone (as napari's act on a layer): no widget, no viewer window."""

from types import SimpleNamespace

import numpy as np
import pytest

napari = pytest.importorskip("napari")
from napari.layers import Image  # noqa: E402

from triton_sam.plugin import bindings  # noqa: E402


class Target:
    """What the bindings use of an `Interaction`."""

    def __init__(self, interactive: bool = True) -> None:
        self.image = Image(np.zeros((30, 50)), scale=(2.0, 2.0))
        self.cursor = None
        self.calls = []
        self._interactive = interactive

    def interactive(self) -> bool:
        return self._interactive

    def acts(self) -> bool:  # a click's check (the real one also says why it refuses)
        return self._interactive

    def __getattr__(self, name):  # hover, add_point, set_box, show_box: recorded
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


def _event(kind: str, position, modifiers=()) -> SimpleNamespace:
    return SimpleNamespace(type=kind, position=np.asarray(position, float), modifiers=list(modifiers), button=1)


def _viewer() -> SimpleNamespace:
    return SimpleNamespace(camera=SimpleNamespace(zoom=1.0, mouse_pan=True))


def test_a_move_previews_in_image_pixels_and_is_remembered_even_when_not_interactive():
    target = Target()
    bindings.hover(target, _viewer(), _event("mouse_move", (20.0, 40.0)))
    assert target.calls == [("hover", (20.0, 10.0), {})] and list(target.cursor) == [20.0, 40.0]
    resting = Target(interactive=False)
    bindings.hover(resting, _viewer(), _event("mouse_move", (20.0, 40.0)))
    assert resting.calls == [] and resting.cursor is not None


def test_a_click_adds_a_point_and_a_ctrl_drag_sets_a_box():
    target, viewer = Target(), _viewer()
    event = _event("mouse_press", (20.0, 40.0), [bindings.NEGATIVE_MODIFIER])
    drag = bindings.press(target, viewer, event)
    next(drag)
    event.type = "mouse_release"
    with pytest.raises(StopIteration):
        next(drag)
    assert target.calls == [("add_point", (20.0, 10.0), {"positive": False})]

    target = Target()
    event = _event("mouse_press", (0.0, 0.0), [bindings.BOX_MODIFIER])
    drag = bindings.press(target, viewer, event)
    next(drag)
    event.type, event.position = "mouse_move", np.asarray([20.0, 40.0])
    next(drag)
    assert not viewer.camera.mouse_pan and target.calls == [("show_box", ((0.0, 0.0, 20.0, 10.0),), {})]
    event.type = "mouse_release"
    with pytest.raises(StopIteration):
        next(drag)
    assert viewer.camera.mouse_pan and target.calls[-1] == ("set_box", (0.0, 0.0, 20.0, 10.0), {})
