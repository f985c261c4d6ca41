"""The panel's status area: which engine runs, what to do now, and the figures behind it on hover.

Each kind of news has its place: the engine label says where the model runs (from Start on); the
message says what the user needs now (how to segment, what is under way) or an error, whole and
with the fix it names, in the theme's warning colour; the message's tooltip holds the figures
(how long the plane took to encode, how fast previews come) and the gRPC detail an error quoted.
"""

from __future__ import annotations

import re

from qtpy.QtCore import Qt
from qtpy.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

_GRPC_DETAIL = re.compile(r"\s*\(StatusCode\.(?:[^()]|\([^()]*\))*\)")  # "(StatusCode.UNAVAILABLE: ...)"


def without_grpc_detail(text: str) -> str:
    """`text` without the gRPC detail an error of the server quotes (the message says what to do)."""
    return _GRPC_DETAIL.sub("", text)


def _wrapped_label(text: str = "") -> QLabel:
    """A label that wraps its plain text to the panel's width; a long word (a path) never widens the panel."""
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)  # "<image> [triton-sam objects]" is no markup
    label.setWordWrap(True)
    policy = QSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    policy.setHeightForWidth(True)
    label.setSizePolicy(policy)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)  # a fix's command can be copied
    return label


class StatusArea(QWidget):
    """The engine label (`engine_label`, hidden until `show_engine`) above the message (`label`).

    `say` shows news in the normal colour, `warn` an error in `warning_colour` (napari's theme
    sets it); both show the text whole. `set_figure` puts telemetry in the message's tooltip.
    """

    def __init__(self) -> None:
        super().__init__()
        self.engine_label = _wrapped_label()
        self.engine_label.setToolTip("Where the model runs: the engine Start made")
        self.engine_label.hide()
        self.label = _wrapped_label("Not started.")
        self.warning_colour = "#e3b617"  # napari's dark theme's, until the panel sets the viewer's
        self.error_shown = False
        self.engine_trouble = False  # the error shown is the engine's (a decode failed): a preview ends it
        self._said = self.label.text()  # the message as said, gRPC detail included
        self._figures: dict[str, str] = {}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.engine_label)
        layout.addWidget(self.label)

    def say(self, text: str) -> None:
        """Show `text` in the normal colour."""
        self._show(text, error=False)

    def warn(self, text: str, engine_trouble: bool = False) -> None:
        """Show the error `text` in the warning colour, whole (gRPC's detail in the tooltip);
        `engine_trouble`: the engine failed, and a preview shown again means it works again."""
        self._show(text, error=True)
        self.engine_trouble = engine_trouble

    def _show(self, text: str, error: bool) -> None:
        self._said, self.error_shown, self.engine_trouble = text, error, False
        self.label.setText(without_grpc_detail(text))
        self._colour()
        self._update_tooltip()

    def shows(self, text: str) -> bool:
        """Whether the message is `text` still (nothing was said since)."""
        return self._said == text

    def set_warning_colour(self, colour: str) -> None:
        """The colour errors are shown in (the viewer's theme changed); an error shown takes it at once."""
        self.warning_colour = colour
        self._colour()

    def _colour(self) -> None:
        self.label.setStyleSheet(f"QLabel {{ color: {self.warning_colour}; }}" if self.error_shown else "")

    def show_engine(self, description: str | None) -> None:
        """Show where the model runs (`Engine.describe()`); None: no engine (the panel stopped), and
        the figures of the last one go."""
        if description is None:
            self.engine_label.hide()
            self._figures.clear()
            self._update_tooltip()
            return
        self.engine_label.setText(f"Engine: {description}")
        self.engine_label.show()

    def set_figure(self, kind: str, text: str) -> None:
        """Telemetry for the tooltip, one line of each `kind` ("encoding", "preview"): the newest."""
        self._figures[kind] = text
        self._update_tooltip()

    def _update_tooltip(self) -> None:
        detail = [self._said] if self._said != self.label.text() else []
        self.label.setToolTip("\n\n".join(detail + list(self._figures.values())))
