"""Mouse bindings act on their target alone (as napari's act on a layer): no widget, no viewer window."""

import re
from types import SimpleNamespace

import numpy as np
import pytest

napari = pytest.importorskip("napari")
from napari.layers import Image  # noqa: E402
from napari.utils.key_bindings import KeymapProvider  # noqa: E402

from triton_sam.plugin import bindings, keys  # noqa: E402


class Target:
    """What the bindings use of an `Interaction`."""

    def __init__(self, interactive: bool = True) -> None:
        self.image = Image(np.zeros((30, 50)), scale=(2.0, 2.0))
        self.cursor = None
        self.negative_points = False
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


def test_a_click_adds_a_point_and_a_ctrl_drag_sets_a_box_negative_with_alt():
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
    assert viewer.camera.mouse_pan and target.calls[-1] == ("set_box", (0.0, 0.0, 20.0, 10.0), {"positive": True})

    target = Target()  # with the negative modifier too: a negative box (Find's "not this")
    drag = bindings.press(
        target, viewer, event := _event("mouse_press", (0.0, 0.0), [bindings.BOX_MODIFIER, bindings.NEGATIVE_MODIFIER])
    )
    next(drag)
    event.type, event.position = "mouse_release", np.asarray([20.0, 40.0])
    with pytest.raises(StopIteration):
        next(drag)
    assert target.calls[-1] == ("set_box", (0.0, 0.0, 20.0, 10.0), {"positive": False})


def _click(target, modifiers=()) -> None:
    drag = bindings.press(target, _viewer(), event := _event("mouse_press", (20.0, 40.0), modifiers))
    next(drag)
    event.type = "mouse_release"
    with pytest.raises(StopIteration):
        next(drag)


def test_while_negative_points_are_on_a_click_adds_a_negative_point_and_an_alt_click_a_positive_one():
    target = Target()
    target.negative_points = True
    _click(target)
    _click(target, [bindings.NEGATIVE_MODIFIER])
    assert [call[2]["positive"] for call in target.calls] == [False, True]


def test_unbinding_gives_each_key_back_what_it_had_and_leaves_a_key_bound_since_to_its_owner():
    provider, theirs, later = KeymapProvider(), lambda provider: None, lambda provider: None
    provider.bind_key("Shift-C", theirs)
    bound = bindings.bind_keys(provider, {"Shift-C": lambda p: None, "Shift-N": lambda p: None})
    provider.bind_key("Shift-N", later, overwrite=True)  # another panel, meanwhile
    bindings.unbind_keys(provider, bound)
    assert {str(key): action for key, action in provider.keymap.items()} == {"Shift+C": theirs, "Shift+N": later}


def test_a_custom_set_of_keys_is_read_and_each_mistake_is_named():
    assert keys.parse(" commit=C,discard=Shift-C  negative=t ") == {"commit": "C", "discard": "Shift-C", "negative": "t"}
    assert keys.parse(keys.describe(keys.PRESETS["micro-sam"])) == keys.PRESETS["micro-sam"]
    for text, said in [
        ("commit=C, comit=X", "'comit' is no action; the actions are commit, discard"),
        ("commit=Shft-C", "'Shft-C' is not a key napari knows"),
        ("commit=Shift", "'Shift' is not a key napari knows"),
        ("commit C", "'commit' is not action=key"),
        ("commit=C, discard=c", "c is given to both commit and discard"),
        ("commit=C, commit=X", "commit is given two keys"),
        ("undo=U", "commit needs a key"),
    ]:
        with pytest.raises(keys.KeysError, match=re.escape(said)):
            keys.parse(text)
