"""Segment all's method for the model chosen: a micro-sam model with an instance-segmentation
decoder offers "Decoder (AIS)" (first: micro-sam's automatic instance segmentation) and "Point
grid", each with its own fields; other models the point grid alone, with no chooser. The choice
and the decoder's fields are remembered between sessions, as the form's grid fields are
(`fields.remembered`)."""

from __future__ import annotations

from qtpy.QtCore import QSettings
from qtpy.QtWidgets import QComboBox, QDoubleSpinBox, QSpinBox, QVBoxLayout, QWidget

from ..instance import WatershedSettings
from ..registry import MODELS
from .fields import form_rows, remembered, spin

DECODER, POINT_GRID = "decoder", "grid"
MODES = {"Decoder (AIS)": DECODER, "Point grid": POINT_GRID}
DEFAULTS = WatershedSettings(min_size=100)  # micro-sam's, as its annotator's Automatic Segmentation sets them
# The decoder's fields: what a user tunes of `WatershedSettings` (the smoothings keep micro-sam's defaults).
DECODER_FIELDS = {
    "center_distance_threshold": (
        "Center distance <",
        "Seeds: where the predicted distance to the object's centre is below this (lower: fewer objects)",
    ),
    "boundary_distance_threshold": (
        "Boundary distance <",
        "Seeds: where the predicted boundary distance map is below this (lower: fewer objects)",
    ),
    "foreground_threshold": ("Foreground >", "Objects cover only where the predicted foreground is above this"),
    "min_size": ("Min. size (px)", "Remove objects smaller than this many pixels"),
}


class SegmentAllModes(QWidget):
    """The method chooser (`mode_box`), the point grid's fields (`grid_fields`, the form's) and the
    decoder's (`decoder_spins`, by `WatershedSettings` name); `show_for` follows the model box."""

    def __init__(self, settings: QSettings, grid_fields: QWidget) -> None:
        super().__init__()
        self._settings, self.grid_fields = settings, grid_fields
        self.mode_box = QComboBox()
        self.mode_box.addItems(list(MODES))
        self.mode_box.setToolTip("How Segment all finds objects: the model's instance-segmentation decoder, or prompts on a grid")
        saved = str(settings.value("segment_all/mode", DECODER))
        self.mode_box.setCurrentText(next((k for k, v in MODES.items() if v == saved), "Decoder (AIS)"))
        self.mode_box.currentTextChanged.connect(self._mode_changed)
        self.decoder_spins = {name: self._decoder_spin(name, tip) for name, (_, tip) in DECODER_FIELDS.items()}
        self._mode_row, self.decoder_fields = (
            _rows(("Method", self.mode_box)),
            _rows(*((label, self.decoder_spins[name]) for name, (label, _) in DECODER_FIELDS.items())),
        )
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for part in (self._mode_row, grid_fields, self.decoder_fields):
            layout.addWidget(part)
        self._has_decoder = False
        self._show()

    def _decoder_spin(self, name: str, tip: str):
        """A spin box for the decoder's `name`, at its value last time (else micro-sam's default), remembered as it changes."""
        default = getattr(DEFAULTS, name)
        field = (
            spin(QSpinBox(), 0, 1_000_000, default, tip) if name == "min_size" else spin(QDoubleSpinBox(), 0.0, 1.0, default, tip)
        )
        return remembered(field, self._settings, f"segment_all/{name}")

    def show_for(self, model: str) -> None:
        """Offer the decoder where `model` (a name in the model box) has one."""
        spec = MODELS.get(model)
        self._has_decoder = spec is not None and spec.decoder_url is not None
        self._show()

    def chosen(self) -> str:
        """DECODER or POINT_GRID: the method the fields say (the point grid for a model without a decoder)."""
        return MODES[self.mode_box.currentText()] if self._has_decoder else POINT_GRID

    def decoder_settings(self) -> WatershedSettings:
        """The watershed's settings: the decoder's fields, micro-sam's defaults for the rest."""
        values = {name: field.value() for name, field in self.decoder_spins.items()}
        return WatershedSettings(**{name: round(v, 3) if isinstance(v, float) else v for name, v in values.items()})

    def _mode_changed(self, text: str) -> None:
        self._settings.setValue("segment_all/mode", MODES[text])
        self._show()

    def _show(self) -> None:
        """The chooser where there is a choice, and the fields of the method chosen only."""
        chosen = self.chosen()
        self._mode_row.setVisible(self._has_decoder)
        self.grid_fields.setVisible(chosen == POINT_GRID)
        self.decoder_fields.setVisible(chosen == DECODER)


def _rows(*rows: tuple[str, QWidget]) -> QWidget:
    """A widget holding a form of (label, field) rows, with no margins."""
    widget = QWidget()
    layout = form_rows(*rows)
    layout.setContentsMargins(0, 0, 0, 0)
    widget.setLayout(layout)
    return widget
