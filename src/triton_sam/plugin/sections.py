"""The panel's foldable sections: groups of fields used now and then (server settings, Propagate,
Segment all, the series), folded away so that the fields used all the time and the status stay in
view on a laptop's screen. Each remembers whether the user left it open."""

from __future__ import annotations

from qtpy.QtCore import QSettings
from qtpy.QtWidgets import QWidget
from superqt import QCollapsible

ANIMATION_MS = 120


class Section(QCollapsible):
    """`content` under a button titled `title` that folds and unfolds it; open or not as the user
    left it last time (`settings`, under `sections/<key>`), folded the first time."""

    def __init__(self, title: str, content: QWidget, settings: QSettings, key: str) -> None:
        super().__init__(title)
        self.setDuration(ANIMATION_MS)
        self.layout().setContentsMargins(0, 0, 0, 0)
        self.addWidget(content)
        self._settings, self._key = settings, f"sections/{key}"
        if str(settings.value(self._key, "false")) == "true":
            self.expand(animate=False)
        self.toggled.connect(self._remember)

    def _remember(self, opened: bool) -> None:
        self._settings.setValue(self._key, "true" if opened else "false")
