"""The dock widget's form: backend, server, model and layer, remembered between sessions.

Only fields and their settings live here; `widget.TritonSamWidget` gives them behaviour.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from qtpy.QtCore import QSettings, Qt
from qtpy.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QGroupBox,
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
from ..registry import DEFAULT_MODEL, MODELS, ModelSpec, get_model
from ..repository import ENV_MODEL_REPOSITORY, default_model_repository
from ..video.propagation import BACKWARDS, BOTH, FORWARDS
from .bindings import BOX_MODIFIER, KEYS, NEGATIVE_MODIFIER

BACKENDS = {"Auto": "auto", "Triton": "triton", "Local": "local"}
DIRECTIONS = {"Both ways": BOTH, "Forwards": FORWARDS, "Backwards": BACKWARDS}
REGIONS = {"Whole plane": "plane", "Visible region": "view"}
PROPAGATED = {"Selected label": False, "All on this plane": True}  # does Propagate track every label?
ENV_BACKEND = "TRITON_SAM_BACKEND"
ENV_MODEL = "TRITON_SAM_MODEL"


STATUS_CHARS = 160  # longer messages are cut; the status line's tooltip has all of it
_GRPC_DETAIL = re.compile(r"\s*\(StatusCode\.(?:[^()]|\([^()]*\))*\)")  # "(StatusCode.UNAVAILABLE: ...)"


def short_status(text: str) -> str:
    """`text` for the status line: without gRPC's detail, at most `STATUS_CHARS` characters."""
    text = _GRPC_DETAIL.sub("", text)
    return text if len(text) <= STATUS_CHARS else text[: STATUS_CHARS - 1].rstrip() + "…"


def _setting(settings: QSettings, key: str, env: str, default: str) -> str:
    """Environment first, then what the user chose last time, then the default."""
    return os.environ.get(env) or str(settings.value(key, default))


def _flag(settings: QSettings, key: str, default: bool) -> bool:
    return str(settings.value(key, "true" if default else "false")) == "true"


class _VerticalScroll(QScrollArea):
    """Scrolls its widget up and down only, at least as wide as the widget needs (known once it
    is styled: napari's style sheet widens fields)."""

    def __init__(self) -> None:
        super().__init__()
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.setMinimumWidth(self.widget().minimumSizeHint().width() + self.verticalScrollBar().sizeHint().width())
        super().showEvent(event)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        short = self.widget().minimumSizeHint().width() - self.viewport().width()  # frame and scroll bar as styled
        if self.isVisible() and short > 0:
            self.setMinimumWidth(self.width() + short)


class SettingsForm(QWidget):
    """The fields of the dock widget, laid out, filled from the environment and the last session."""

    def __init__(self) -> None:
        super().__init__()
        self._settings = QSettings("triton-sam", "triton-sam")
        s = self._settings
        self.backend = QComboBox()
        self.backend.addItems(list(BACKENDS))
        chosen = _setting(s, "backend", ENV_BACKEND, "auto").lower()
        self.backend.setCurrentText(next((k for k, v in BACKENDS.items() if v == chosen), "Auto"))
        self.url = QLineEdit(_setting(s, "url", ENV_URL, default_url()))
        self.api_key = QLineEdit(os.environ.get(ENV_API_KEY, ""))
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.tls = QCheckBox("TLS")
        self.tls.setChecked(_flag(s, "tls", False))
        self.model = QComboBox()
        self.model.addItems(list(MODELS))
        self.model.setCurrentText(_setting(s, "model", ENV_MODEL, DEFAULT_MODEL))
        self.repository = QLineEdit(_setting(s, "repository", ENV_MODEL_REPOSITORY, str(default_model_repository().resolve())))
        self.layer = QComboBox()
        self.refresh = QPushButton("Find models")
        self.start = QPushButton("Start")
        self.disk_cache = QCheckBox("Keep embeddings on disk")
        self.disk_cache.setChecked(_flag(s, "disk_cache", True))
        self.encode_all = QPushButton("Encode all planes")
        self.propagate = QPushButton("Propagate label")
        self.propagate.setToolTip(
            "Track the objects layer's selected label from the plane on screen through the stack "
            "(SAM2.1 memory). Its mask on this plane is the prompt; correct a plane and propagate again from it."
        )
        self.direction = QComboBox()
        self.direction.addItems(list(DIRECTIONS))
        self.propagated = QComboBox()
        self.propagated.addItems(list(PROPAGATED))
        self.propagated.setToolTip(
            "Track the objects layer's selected label, or every label on the plane on screen together "
            "(then each pixel goes to one of them: their masks never overlap)"
        )
        self.max_planes = QSpinBox()
        self.max_planes.setRange(0, 1_000_000)
        self.max_planes.setSpecialValueText("all")
        self.max_planes.setToolTip("How many planes to track each way from the plane on screen (all: to the end of the stack)")
        self.segment_all = QPushButton("Segment all")
        self.segment_all.setToolTip(
            "Find every object on the plane on screen (or in the view) from a grid of point prompts, "
            "into a new labels layer; the objects layer is not touched. Press again to stop."
        )
        self.region = QComboBox()
        self.region.addItems(list(REGIONS))
        self.points_per_side = _spin(QSpinBox(), 4, 128, 32, "Prompts: a grid of this many points a side")
        self.pred_iou = _spin(QDoubleSpinBox(), 0.0, 1.0, 0.8, "Keep masks whose predicted IoU is above this")
        self.stability = _spin(QDoubleSpinBox(), 0.0, 1.0, 0.95, "Keep masks at least this stable (IoU at logit 0 +/- 1)")
        self.min_area = _spin(
            QSpinBox(),
            0,
            1_000_000,
            0,
            "Remove holes and specks up to this size (0: keep all). As the official generators count it: "
            "SAM2.1 in pixels of its 256 x 256 low-res masks, SAM1 and MobileSAM in image pixels.",
        )
        self.enabled = QCheckBox("SAM interaction (hover, click, keys)")
        self.enabled.setChecked(True)
        self.status = QLabel("Not started.")
        self.status.setWordWrap(True)
        self._lay_out()

    def _lay_out(self) -> None:
        keys = QLabel(
            f"Hover: preview · click: add · {NEGATIVE_MODIFIER}-click: exclude · {BOX_MODIFIER}-drag: box<br>"
            f"{KEYS['commit']}: commit · {KEYS['undo']}: undo prompt · {KEYS['cycle']}: next candidate · "
            f"{KEYS['discard']}: discard<br>"
            f"Yellow: what {KEYS['commit']} stores · blue: what a click at the cursor would add"
        )
        keys.setWordWrap(True)
        form = QFormLayout()
        for label, field in (
            ("Backend", self.backend),
            ("Triton URL", self.url),
            ("API key", self.api_key),
            ("", self.tls),
            ("Model", self.model),
            ("", self.refresh),
            ("Model repository", self.repository),
            ("Image layer", self.layer),
        ):
            form.addRow(label, field)
        fields = QWidget()
        layout = QVBoxLayout(fields)
        layout.addLayout(form)
        for widget in (self.disk_cache, self.start):
            layout.addWidget(widget)
        self.stacks = self._propagation_box()
        layout.addWidget(self.stacks)
        layout.addWidget(self._segment_all_box())
        for widget in (self.enabled, self.status, keys):
            layout.addWidget(widget)
        layout.addStretch()
        scroll = _VerticalScroll()  # a laptop's screen is shorter than the panel: it scrolls, never squeezes
        scroll.setWidget(fields)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)

    def _propagation_box(self) -> QGroupBox:
        box = QGroupBox("Stacks (z or t)")
        rows = QFormLayout(box)
        rows.addRow(self.encode_all)
        run = QHBoxLayout()
        run.addWidget(self.propagate)
        run.addWidget(self.direction)
        rows.addRow(run)
        rows.addRow("Labels", self.propagated)
        rows.addRow("Planes each way", self.max_planes)
        return box

    def _segment_all_box(self) -> QGroupBox:
        box = QGroupBox("Automatic segmentation")
        rows = QFormLayout(box)
        run = QHBoxLayout()
        run.addWidget(self.segment_all)
        run.addWidget(self.region)
        rows.addRow(run)
        for label, field in (
            ("Points per side", self.points_per_side),
            ("Predicted IoU >", self.pred_iou),
            ("Stability >=", self.stability),
            ("Min. region (px)", self.min_area),
        ):
            rows.addRow(label, field)
        return box

    # --- what the form says ---------------------------------------------------------------------

    def chosen_backend(self) -> str:
        """ "auto", "triton" or "local"."""
        return BACKENDS[self.backend.currentText()]

    def chosen_direction(self) -> str:
        """ "both", "forwards" or "backwards"."""
        return DIRECTIONS[self.direction.currentText()]

    def propagates_all(self) -> bool:
        """Whether Propagate tracks every label on the plane on screen (else the selected one)."""
        return PROPAGATED[self.propagated.currentText()]

    def chosen_max_planes(self) -> int | None:
        """How many planes to track each way; None: to the end of the stack."""
        return self.max_planes.value() or None

    def chosen_region(self) -> str:
        """ "plane" or "view": what Segment all segments."""
        return REGIONS[self.region.currentText()]

    def automatic_options(self) -> dict:
        """The generator's parameters the form sets (the rest keep the official defaults)."""
        return {
            "points_per_side": self.points_per_side.value(),
            "pred_iou_thresh": round(self.pred_iou.value(), 3),
            "stability_score_thresh": round(self.stability.value(), 3),
            "min_mask_region_area": self.min_area.value(),
        }

    def chosen_model(self) -> ModelSpec:
        return get_model(self.model.currentText())

    def chosen_repository(self) -> Path:
        return Path(self.repository.text()).expanduser()

    def connection(self) -> TritonConnection:
        """The Triton server the form names."""
        url, api_key = self.url.text().strip() or None, self.api_key.text() or None
        return TritonConnection(url=url, ssl=self.tls.isChecked(), api_key=api_key)

    def set_status(self, text: str) -> None:
        """Show `text` shortened (`short_status`); the status line's tooltip has all of it."""
        self.status.setText(short_status(text))
        self.status.setToolTip(text)

    def save_settings(self) -> None:
        """Remember the choices for the next session (the API key is never stored)."""
        s = self._settings
        s.setValue("backend", self.chosen_backend())
        s.setValue("url", self.url.text())
        s.setValue("tls", "true" if self.tls.isChecked() else "false")
        s.setValue("model", self.model.currentText())
        s.setValue("repository", self.repository.text())
        s.setValue("disk_cache", "true" if self.disk_cache.isChecked() else "false")


def _spin(field, low, high, value, tip: str):
    """`field` (a QSpinBox or QDoubleSpinBox) with its range, value and tooltip set."""
    field.setRange(low, high)
    if isinstance(field, QDoubleSpinBox):
        field.setDecimals(2)
        field.setSingleStep(0.05)
    field.setValue(value)
    field.setToolTip(tip)
    return field
