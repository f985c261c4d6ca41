"""Which key does what: two presets (triton-sam's own keys, and micro-sam's for its users' hands)
or a custom set, chosen in the panel ("Keys") and bound at once.

napari's shortcut editor (Preferences > Shortcuts) cannot list these: it lists napari's
`action_manager` actions (`napari/_qt/widgets/qt_keyboard_settings.py`), which is not public plugin
API, and napari registers a plugin manifest's commands with no key bindings, never reading its
`contributions.keybindings` (`napari/plugins/_npe2.py`, `_npe2_manifest_to_actions`). So the keys
are bound with public API (`bind_key` of the viewer and of layers) and changed here: a custom set
is written `commit=C, discard=Shift-C, ...` in the panel or in `TRITON_SAM_KEYS`.

napari gives a key to the active layer before the viewer: keys that napari's layer types use
themselves (micro-sam's C is an image layer's auto-contrast, S a points or shapes layer's select
mode, T a shapes layer's path mode) are also bound on the session's own layers while one of them
is active, as micro-sam binds S on its prompt layers.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from napari.utils.key_bindings import coerce_keybinding

from . import bindings, layers

ENV_KEYS = "TRITON_SAM_KEYS"  # a preset's name, or a custom set: "commit=C, discard=Shift-C, ..."
CUSTOM = "Custom"
DEFAULT = "triton-sam"
ACTIONS = {  # name in a custom set: what its key does, as the panel says it
    "commit": "commit",
    "discard": "discard",
    "undo": "undo prompt",
    "cycle": "next candidate",
    "negative": "clicks add negative points (on/off)",
    "segment": "show the object its prompts make",
    "next_image": "next image of the series",
    "previous_image": "previous image of the series",
    "image_done": "image done, next",
}
SERIES_ACTIONS = {"next_image": "next", "previous_image": "previous", "image_done": "done"}  # the series panel's methods
SERIES_KEYS = {"next_image": "PageDown", "previous_image": "PageUp", "image_done": "Shift-D"}
PRESETS = {
    DEFAULT: {**bindings.KEYS, **SERIES_KEYS},
    # micro-sam's annotators: C commit, Shift-C clear the prompts, T toggle the point label, S
    # segment (previews here are live: S shows the object from its prompts, without the cursor's part)
    "micro-sam": {
        "commit": "C",
        "discard": "Shift-C",
        "undo": "Shift-U",
        "cycle": "Shift-N",
        "negative": "T",
        "segment": "S",
        **SERIES_KEYS,
        "next_image": "N",  # micro-sam's image series annotator: "Next Image [N]"
    },
}
NEXT_NEGATIVE = "Next point: negative ({key} again: positive; {modifier}-click: positive)."
NEXT_POSITIVE = "Next point: positive."


class KeysError(ValueError):
    """A custom set of keys that cannot be bound; the message says why."""


def parse(text: str, viewer=None) -> dict[str, str]:
    """The custom set `text` ("commit=C, discard=Shift-C, ..."), as {action: key}; a key of
    `viewer`'s own (napari's viewer keys) is refused, as are unknown actions or keys, an action or
    a key given twice, and a set without commit."""
    keys: dict[str, str] = {}
    taken: dict = {}
    napari_own = _class_keys(viewer) if viewer is not None else set()
    for item in filter(None, re.split(r"[,\s]+", text.strip())):
        name, equals, key = item.partition("=")
        if not equals or not name or not key:
            raise KeysError(f"'{item}' is not action=key (e.g. commit=C)")
        if name not in ACTIONS:
            raise KeysError(f"'{name}' is no action; the actions are {', '.join(ACTIONS)}")
        if name in keys:
            raise KeysError(f"{name} is given two keys")
        binding = _binding(key)
        if binding in taken:
            raise KeysError(f"{key} is given to both {taken[binding]} and {name}")
        if binding in napari_own:
            raise KeysError(f"{key} is one of napari's own viewer keys")
        keys[name], taken[binding] = key, name
    if "commit" not in keys:
        raise KeysError("commit needs a key (e.g. commit=C)")
    return keys


def describe(keys: dict[str, str]) -> str:
    """`keys` as a custom set is written: "commit=C, discard=Shift-C, ..."."""
    return ", ".join(f"{name}={key}" for name, key in keys.items())


def help_line(keys: dict[str, str]) -> str:
    """What each key does, in the actions' order: "Shift-C: commit · Shift-X: discard · ..."."""
    return " · ".join(f"{keys[name]}: {what}" for name, what in ACTIONS.items() if name in keys)


def _binding(key: str):
    """napari's key binding for `key`; KeysError for a key napari does not know, a modifier alone
    or a sequence of keys."""
    try:
        binding = coerce_keybinding(key)
    except Exception:  # napari's parser raises several kinds for malformed keys
        binding = None
    if binding is None or not str(binding) or len(binding.parts) != 1 or binding.parts[0].is_modifier_key():
        raise KeysError(f"'{key}' is not a key napari knows (e.g. C, Shift-C, Control-Alt-K, F5)")
    return binding


def _class_keys(provider) -> set:
    """The keys napari binds for `provider`'s classes (its own shortcuts, not any instance's);
    `__class__`, not `type()`: napari hands plugins its viewer and layers behind a proxy."""
    return {key for cls in provider.__class__.__mro__ for key in vars(cls).get("class_keymap", {})}


class KeyChoice:
    """The panel's "Keys" choice (`form.keys_box`, `form.custom_keys_field`), bound on the viewer to
    the methods of `target` (an `interaction.Interaction`) and, for `SERIES_ACTIONS`, of `series`. A
    choice applies at once (the keys bound before are given back) and is saved; a custom set that
    cannot be bound changes nothing and the status says why. `close()` gives every key back."""

    def __init__(self, viewer, target, form, series) -> None:
        self.viewer, self.target, self.form, self.series = viewer, target, form, series
        self.keys: dict[str, str] = {}
        self._actions: dict[str, Callable] = {}  # key: what it calls
        self._bound: dict = {}
        self._layer, self._layer_bound = None, {}
        form.keys_box.currentTextChanged.connect(self.apply)
        form.custom_keys_field.editingFinished.connect(self.apply)
        viewer.layers.selection.events.active.connect(self._follow)
        self.apply(save=False)

    def apply(self, *_, save: bool = True) -> None:
        """Bind the keys the form chooses (a preset's, or its custom set)."""
        form = self.form
        choice = form.keys_box.currentText()
        form.custom_keys_field.setEnabled(choice == CUSTOM)
        if choice == CUSTOM and not form.custom_keys_field.text().strip():
            form.custom_keys_field.setText(describe(self.keys or PRESETS[DEFAULT]))  # to edit from
        try:
            keys = parse(form.custom_keys_field.text(), self.viewer) if choice == CUSTOM else PRESETS[choice]
        except KeysError as error:
            if not self.keys:  # the panel opens (TRITON_SAM_KEYS, say): the default keys
                self.use(PRESETS[DEFAULT])
            form.status.warn(f"Custom keys not used: {error}. Keys: {help_line(self.keys)}.")
            return
        self.use(keys)
        if save:
            form.save_keys()
            form.set_status(f"Keys ({choice}): {help_line(keys)}")

    def use(self, keys: dict[str, str]) -> None:
        """Bind `keys` in place of the keys bound now; clicks add positive points again."""
        self._unbind()
        self.keys = dict(keys)
        self.target.negative_points = False
        self.target.keys = self.keys  # what its messages name
        self._actions = {key: self._action(name) for name, key in keys.items()}
        self._bound = bindings.bind_keys(self.viewer, self._actions)
        self.form.show_keys(self.keys)
        self._follow()

    def close(self) -> None:
        self.viewer.layers.selection.events.active.disconnect(self._follow)
        self.form.keys_box.currentTextChanged.disconnect(self.apply)
        self.form.custom_keys_field.editingFinished.disconnect(self.apply)
        self._unbind()

    def _action(self, name: str) -> Callable:
        """What the key of action `name` calls (napari passes it the viewer or layer it is bound on)."""
        if name == "negative":
            return lambda provider: self._toggle_negative()
        if name == "segment":
            return lambda provider: self._segment()
        method = getattr(self.series, SERIES_ACTIONS[name]) if name in SERIES_ACTIONS else getattr(self.target, name)
        return lambda provider: method()

    def _toggle_negative(self) -> None:
        """micro-sam's T: clicks add negative points (Alt-click a positive one) until pressed again."""
        target = self.target
        target.negative_points = not target.negative_points
        key, modifier = self.keys["negative"], bindings.NEGATIVE_MODIFIER
        self.form.set_status(NEXT_NEGATIVE.format(key=key, modifier=modifier) if target.negative_points else NEXT_POSITIVE)

    def _segment(self) -> None:
        """micro-sam's S: previews are live, so it shows the object its prompts make alone (the
        cursor's part goes until the next move)."""
        if self.target.acts():
            self.target.leave()

    def _unbind(self) -> None:
        self._leave_layer()
        bindings.unbind_keys(self.viewer, self._bound)
        self._bound = {}

    def _own_layers(self) -> list:
        """The session's layers: its image, prompts, box, preview and objects."""
        t = self.target
        own = [t.image, t.prompts, t.box, getattr(t.preview, "layer", None)]
        if t.image is not None:
            own.append(layers.existing_objects_layer(self.viewer, t.image))
        return [layer for layer in own if layer is not None]

    def _follow(self, event=None) -> None:
        """The active layer changed: if it is one of the session's, the keys its type uses itself
        are bound on it too (napari asks the active layer first); the layer before gets them back."""
        self._leave_layer()
        active = self.viewer.layers.selection.active
        if active is None or active not in self._own_layers():  # (==: a proxy of a layer is another object)
            return
        claimed = _class_keys(active)
        shadowed = {key: action for key, action in self._actions.items() if coerce_keybinding(key) in claimed}
        self._layer, self._layer_bound = active, bindings.bind_keys(active, shadowed)

    def _leave_layer(self) -> None:
        if self._layer is not None:
            bindings.unbind_keys(self._layer, self._layer_bound)
        self._layer, self._layer_bound = None, {}
