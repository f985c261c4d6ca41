"""The dock widget's form: backend, server, model and layer, remembered between sessions.

Only fields and their settings live here, and the status area (`status.StatusArea`) under them;
`widget.TritonSamWidget` holds the form and gives them behaviour. Each field is named for its
role and its kind (`model_box`, `start_button`), so that no name of a field is also the name of a
layer or an engine.
"""

from __future__ import annotations

import os
from pathlib import Path

from qtpy.QtCore import QEvent, QSettings, QSignalBlocker, QSize, Qt, Signal
from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from ..engines import TritonConnection
from ..engines.connection import ENV_API_KEY, ENV_URL, default_url
from ..instance import WatershedSettings
from ..registry import DEFAULT_MODEL, ModelSpec, get_model
from ..repository import ENV_MODEL_REPOSITORY, default_model_repository
from ..video.propagation import BACKWARDS, BOTH, FORWARDS
from .bindings import BOX_MODIFIER, KEYS, NEGATIVE_MODIFIER
from .fields import form_rows, remembered, spin
from .keys import CUSTOM, DEFAULT, ENV_KEYS, PRESETS, help_line
from .sections import Section
from .segment_all_modes import SegmentAllModes
from .status import StatusArea

BACKENDS = {"Auto": "auto", "Triton": "triton", "Local": "local"}
DIRECTIONS = {"Both ways": BOTH, "Forwards": FORWARDS, "Backwards": BACKWARDS}
REGIONS = {"Whole plane": "plane", "Visible region": "view"}
PROPAGATED = {"Selected label": False, "All on this plane": True}  # does Propagate track every label?
ENV_BACKEND = "TRITON_SAM_BACKEND"
ENV_MODEL = "TRITON_SAM_MODEL"


def _setting(settings: QSettings, key: str, env: str, default: str) -> str:
    """Environment first, then what the user chose last time, then the default."""
    return os.environ.get(env) or str(settings.value(key, default))


def _flag(settings: QSettings, key: str, default: bool) -> bool:
    return str(settings.value(key, "true" if default else "false")) == "true"


class _VerticalScroll(QScrollArea):
    """Scrolls its widget up and down only, at least as wide as the widget needs (known once it
    is styled: napari's style sheet widens fields), and asks for the widget's whole height (as its
    sections fold and unfold), so that what comes under it follows it rather than the dock's bottom."""

    def __init__(self) -> None:
        super().__init__()
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.setMinimumWidth(self.widget().minimumSizeHint().width() + self.verticalScrollBar().sizeHint().width())
        super().showEvent(event)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        hint = super().sizeHint()
        return QSize(hint.width(), self.widget().sizeHint().height() + 2 * self.frameWidth())

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt's name)
        if watched is self.widget() and event.type() == QEvent.Type.LayoutRequest:
            self.updateGeometry()  # a section folded or unfolded: the widget's height changed
        return super().eventFilter(watched, event)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        short = self.widget().minimumSizeHint().width() - self.viewport().width()  # frame and scroll bar as styled
        if self.isVisible() and short > 0:
            self.setMinimumWidth(self.width() + short)


class SettingsForm(QWidget):
    """The fields of the dock widget, laid out, filled from the environment and the last session."""

    repository_changed = Signal()  # another model repository typed or chosen (and saved)

    def __init__(self) -> None:
        super().__init__()
        self._settings = QSettings("triton-sam", "triton-sam")
        s = self._settings
        self.backend_box = QComboBox()
        self.backend_box.addItems(list(BACKENDS))
        chosen = _setting(s, "backend", ENV_BACKEND, "auto").lower()
        self.backend_box.setCurrentText(next((k for k, v in BACKENDS.items() if v == chosen), "Auto"))
        self.url_field = QLineEdit(_setting(s, "url", ENV_URL, default_url()))
        self.url_field.setToolTip("host:port of the Triton server's gRPC port; several servers comma-separated")
        self.api_key_field = QLineEdit(os.environ.get(ENV_API_KEY, ""))
        self.api_key_field.setEchoMode(QLineEdit.EchoMode.Password)
        self.tls_check = QCheckBox("TLS")
        self.tls_check.setChecked(_flag(s, "tls", False))
        self.model_box = QComboBox()  # what the repository or server offers (`show_models`); until then, the last choice
        self.model_box.addItem(_setting(s, "model", ENV_MODEL, DEFAULT_MODEL))
        self.repository_field = QLineEdit(
            _setting(s, "repository", ENV_MODEL_REPOSITORY, str(default_model_repository().resolve()))
        )
        self.repository_field.editingFinished.connect(self._repository_edited)
        self._repository = self.repository_field.text()  # as last listed
        self.repository_button = QPushButton("…")
        self.repository_button.setToolTip("Choose the model repository folder (`triton-sam models` prints the default)")
        self.repository_button.clicked.connect(self.choose_repository)
        self.image_box = QComboBox()
        self.find_models_button = QPushButton("Find models")
        self.start_button = QPushButton("Start")
        self.disk_cache_check = QCheckBox("Keep embeddings on disk")
        self.disk_cache_check.setChecked(_flag(s, "disk_cache", True))
        self.encode_all_button = QPushButton("Encode all planes")
        self.propagate_button = QPushButton("Propagate label")
        self.propagate_button.setToolTip(
            "Track the objects layer's selected label from the plane on screen through the stack "
            "(SAM2.1 memory). Its mask on this plane is the prompt; correct a plane and propagate again from it."
        )
        self.direction_box = QComboBox()
        self.direction_box.addItems(list(DIRECTIONS))
        self.propagated_box = QComboBox()
        self.propagated_box.addItems(list(PROPAGATED))
        self.propagated_box.setToolTip(
            "Track the objects layer's selected label, or every label on the plane on screen together "
            "(then each pixel goes to one of them: their masks never overlap)"
        )
        self.max_planes_spin = QSpinBox()
        self.max_planes_spin.setRange(0, 1_000_000)
        self.max_planes_spin.setSpecialValueText("all")
        self.max_planes_spin.setToolTip(
            "How many planes to track each way from the plane on screen (all: to the end of the stack)"
        )
        self.segment_all_button = QPushButton("Segment all")
        self.segment_all_button.setToolTip(
            "Find every object on the plane on screen (or in the view), with a micro-sam model's decoder or "
            "from a grid of point prompts, into a new labels layer (on a series image: into its objects layer, "
            "saved). Press again to stop."
        )
        self.region_box = QComboBox()
        self.region_box.addItems(list(REGIONS))
        self.all_planes_check = QCheckBox("All planes")
        self.all_planes_check.setChecked(True)
        self.all_planes_check.setToolTip(
            "On a stack: segment every plane (the same region of each) into one labels layer of the "
            "stack's shape, planes filling in as they are done; off: the plane on screen only"
        )
        self.points_per_side_spin = self._grid_field(
            "points_per_side", QSpinBox(), 4, 128, 32, "Prompts: a grid of this many points a side"
        )
        self.pred_iou_spin = self._grid_field(
            "pred_iou_thresh", QDoubleSpinBox(), 0.0, 1.0, 0.8, "Keep masks whose predicted IoU is above this"
        )
        self.stability_spin = self._grid_field(
            "stability_score_thresh", QDoubleSpinBox(), 0.0, 1.0, 0.95, "Keep masks at least this stable (IoU at logit 0 +/- 1)"
        )
        self.min_area_spin = self._grid_field(
            "min_mask_region_area",
            QSpinBox(),
            0,
            1_000_000,
            0,
            "Remove holes and specks up to this size (0: keep all). As the official generators count it: "
            "SAM2.1 in pixels of its 256 x 256 low-res masks, SAM1 and MobileSAM in image pixels.",
        )
        self.interaction_check = QCheckBox("SAM interaction (hover, click, keys)")
        self.interaction_check.setChecked(True)
        self.keys_box, self.custom_keys_field = QComboBox(), QLineEdit()
        self.keys_box.addItems([*PRESETS, CUSTOM])
        self.keys_box.setToolTip("Which key does what; micro-sam: its annotators' keys. Applies at once.")
        self.custom_keys_field.setToolTip("Custom keys, e.g. commit=C, discard=Shift-C (Enter applies)")
        self._restore_keys(s)
        self.keys: dict[str, str] = dict(KEYS)  # the keys bound (`keys.KeyChoice` says)
        self.keys_label = QLabel()
        self.status = StatusArea()
        self._lay_out()

    def _grid_field(self, option: str, field, low, high, default, tip: str):
        """A field of the point grid's generator `option`, at its value last session (else `default`)."""
        return remembered(spin(field, low, high, default, tip), self._settings, f"segment_all/{option}")

    def _restore_keys(self, s: QSettings) -> None:
        """The keys chosen: `TRITON_SAM_KEYS` (a preset's name or a custom set) first, then last time's."""
        chosen = os.environ.get(ENV_KEYS, "").strip()
        if chosen and chosen not in PRESETS:
            choice, custom = CUSTOM, chosen
        else:
            choice, custom = chosen or str(s.value("keys", DEFAULT)), str(s.value("custom_keys", ""))
        self.keys_box.setCurrentText(choice if choice in (*PRESETS, CUSTOM) else DEFAULT)
        self.custom_keys_field.setText(custom)

    def show_keys(self, keys: dict[str, str]) -> None:
        """Say which keys are bound (under the status)."""
        self.keys = dict(keys)
        self.keys_label.setText(
            f"Hover: preview · click: add · {NEGATIVE_MODIFIER}-click: exclude · {BOX_MODIFIER}-drag: box<br>"
            f"{help_line(keys)}<br>"
            f"Green line: what {keys['commit']} stores · dashes: what a click at the cursor would add"
        )

    def _lay_out(self) -> None:
        """The fields used all the time on top, the rest in folded sections (`add_section`), and the
        status under the scrolled part, always in view."""
        self.show_keys(self.keys)
        self.keys_label.setWordWrap(True)
        fields = QWidget()
        layout = QVBoxLayout(fields)
        layout.addLayout(form_rows(("Backend", self.backend_box), ("Model", self.model_box), ("Image layer", self.image_box)))
        layout.addWidget(self.start_button)
        self.sections: dict[str, Section] = {}  # by key: "settings", "stacks", "segment_all", "series"
        self._sections = QVBoxLayout()
        layout.addLayout(self._sections)
        self.add_section("Server, models and keys", self._settings_box(), "settings")
        self.stacks_group = self._propagation_box()
        self.add_section("Stacks (z or t): Propagate", self.stacks_group, "stacks")
        self.add_section("Segment all", self._segment_all_box(), "segment_all")
        layout.addWidget(self.interaction_check)
        layout.addWidget(self.keys_label)
        layout.addStretch()
        scroll = _VerticalScroll()  # a laptop's screen is shorter than the panel: it scrolls, never squeezes
        scroll.setWidget(fields)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)
        outer.addWidget(self.status)  # errors and news: never scrolled away

    def add_section(self, title: str, content: QWidget, key: str) -> Section:
        """`content` in a foldable section titled `title`, after the others (open as the user left it)."""
        self.sections[key] = section = Section(title, content, self._settings, key)
        self._sections.addWidget(section)
        return section

    def _settings_box(self) -> QWidget:
        box = QWidget()
        rows = form_rows(
            ("Triton URL", self.url_field),
            ("API key", self.api_key_field),
            ("", self.tls_check),
            ("", self.find_models_button),
            ("Model repository", _row(self.repository_field, self.repository_button)),
            ("", self.disk_cache_check),
            ("Keys", self.keys_box),
            ("Custom keys", self.custom_keys_field),
        )
        rows.setContentsMargins(0, 0, 0, 0)
        box.setLayout(rows)
        return box

    def _propagation_box(self) -> QWidget:
        box = QWidget()
        rows = QFormLayout(box)
        rows.setContentsMargins(0, 0, 0, 0)
        rows.addRow(self.encode_all_button)
        run = QHBoxLayout()
        run.addWidget(self.propagate_button)
        run.addWidget(self.direction_box)
        rows.addRow(run)
        rows.addRow("Labels", self.propagated_box)
        rows.addRow("Planes each way", self.max_planes_spin)
        return box

    def _segment_all_box(self) -> QWidget:
        box = QWidget()
        rows = QFormLayout(box)
        rows.setContentsMargins(0, 0, 0, 0)
        run = QHBoxLayout()
        run.addWidget(self.segment_all_button)
        run.addWidget(self.region_box)
        run.addWidget(self.all_planes_check)
        rows.addRow(run)
        grid_fields = QWidget()
        grid_rows = form_rows(
            ("Points per side", self.points_per_side_spin),
            ("Predicted IoU >", self.pred_iou_spin),
            ("Stability >=", self.stability_spin),
            ("Min. region (px)", self.min_area_spin),
        )
        grid_rows.setContentsMargins(0, 0, 0, 0)
        grid_fields.setLayout(grid_rows)
        self.segment_all_modes = SegmentAllModes(self._settings, grid_fields)  # the decoder's fields or the grid's
        self.segment_all_modes.show_for(self.model_box.currentText())
        self.model_box.currentTextChanged.connect(self.segment_all_modes.show_for)
        rows.addRow(self.segment_all_modes)
        return box

    # --- what the form says ---------------------------------------------------------------------

    def chosen_backend(self) -> str:
        """ "auto", "triton" or "local"."""
        return BACKENDS[self.backend_box.currentText()]

    def chosen_direction(self) -> str:
        """ "both", "forwards" or "backwards"."""
        return DIRECTIONS[self.direction_box.currentText()]

    def propagates_all(self) -> bool:
        """Whether Propagate tracks every label on the plane on screen (else the selected one)."""
        return PROPAGATED[self.propagated_box.currentText()]

    def chosen_max_planes(self) -> int | None:
        """How many planes to track each way; None: to the end of the stack."""
        return self.max_planes_spin.value() or None

    def chosen_region(self) -> str:
        """ "plane" or "view": what Segment all segments."""
        return REGIONS[self.region_box.currentText()]

    def segments_all_planes(self) -> bool:
        """Whether Segment all on a stack segments every plane (else the plane on screen)."""
        return self.all_planes_check.isChecked()

    def segment_all_mode(self) -> str:
        """ "decoder" (a micro-sam model's instance decoder) or "grid" (point prompts): how Segment all finds objects."""
        return self.segment_all_modes.chosen()

    def decoder_settings(self) -> WatershedSettings:
        """The decoder mode's watershed settings the form sets."""
        return self.segment_all_modes.decoder_settings()

    def automatic_options(self) -> dict:
        """The generator's parameters the form sets (the rest keep the official defaults)."""
        return {
            "points_per_side": self.points_per_side_spin.value(),
            "pred_iou_thresh": round(self.pred_iou_spin.value(), 3),
            "stability_score_thresh": round(self.stability_spin.value(), 3),
            "min_mask_region_area": self.min_area_spin.value(),
        }

    def chosen_model(self) -> ModelSpec:
        return get_model(self.model_box.currentText())

    def chosen_repository(self) -> Path:
        """The repository field's folder (empty: the default one)."""
        text = self.repository_field.text().strip()
        return Path(text).expanduser() if text else default_model_repository()

    def choose_repository(self) -> None:
        """The "…" button: a folder chooser for the model repository."""
        dialog = QFileDialog(self, "Model repository", str(self.chosen_repository()))
        dialog.setFileMode(QFileDialog.FileMode.Directory)
        dialog.setOption(QFileDialog.Option.ShowDirsOnly)
        if dialog.exec() and dialog.selectedFiles():
            self.repository_field.setText(dialog.selectedFiles()[0])
            self._repository_edited()

    def _repository_edited(self) -> None:
        """The repository field holds another folder: remember it, and say so (`repository_changed`)."""
        if self.repository_field.text() != self._repository:
            self._repository = self.repository_field.text()
            self._settings.setValue("repository", self._repository)
            self.repository_changed.emit()

    def show_models(self, models: list[str]) -> None:
        """List `models` in the model box, the one chosen kept if listed; none: the choice stays alone."""
        current = self.model_box.currentText()
        with QSignalBlocker(self.model_box):  # the box passes through other names while it is filled
            self.model_box.clear()
            self.model_box.addItems(models or [current])
            self.model_box.setCurrentText(current)
        if self.model_box.currentText() != current:
            self.model_box.currentTextChanged.emit(self.model_box.currentText())

    def connection(self) -> TritonConnection:
        """The Triton server the form names."""
        url, api_key = self.url_field.text().strip() or None, self.api_key_field.text() or None
        return TritonConnection(url=url, ssl=self.tls_check.isChecked(), api_key=api_key)

    def set_status(self, text: str) -> None:
        """Show `text` in the status area, whole (an error: `status.warn`)."""
        self.status.say(text)

    def save_settings(self) -> None:
        """Remember the choices for the next session (the API key is never stored)."""
        s = self._settings
        s.setValue("backend", self.chosen_backend())
        s.setValue("url", self.url_field.text())
        s.setValue("tls", "true" if self.tls_check.isChecked() else "false")
        s.setValue("model", self.model_box.currentText())
        s.setValue("repository", self.repository_field.text())
        s.setValue("disk_cache", "true" if self.disk_cache_check.isChecked() else "false")

    def save_keys(self) -> None:
        """Remember the keys chosen (when they are bound: a custom set that cannot be is not kept)."""
        self._settings.setValue("keys", self.keys_box.currentText())
        if self.keys_box.currentText() == CUSTOM:
            self._settings.setValue("custom_keys", self.custom_keys_field.text())


def _row(field: QWidget, button: QPushButton) -> QWidget:
    """`field` with `button` at its right."""
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(field, 1)
    layout.addWidget(button)
    return row
