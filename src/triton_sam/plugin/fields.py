"""Builders of the panel's fields, shared by the form (`form.SettingsForm`) and its parts."""

from __future__ import annotations

from qtpy.QtCore import QSettings
from qtpy.QtWidgets import QDoubleSpinBox, QFormLayout, QWidget


def form_rows(*rows: tuple[str, QWidget]) -> QFormLayout:
    """A form of (label, field) rows."""
    form = QFormLayout()
    for label, field in rows:
        form.addRow(label, field)
    return form


def spin(field, low, high, value, tip: str):
    """`field` (a QSpinBox or QDoubleSpinBox) with its range, value and tooltip set."""
    field.setRange(low, high)
    if isinstance(field, QDoubleSpinBox):
        field.setDecimals(2)
        field.setSingleStep(0.05)
    field.setValue(value)
    field.setToolTip(tip)
    return field


def remembered(field, settings: QSettings, key: str):
    """`field` (a spin box) at its value of last session, kept under `key` in `settings` as it
    changes: a user's tuning outlives the panel (its own value stands the first time)."""
    saved = settings.value(key)
    if saved is not None:
        field.setValue(type(field.value())(saved))
    field.valueChanged.connect(lambda changed: settings.setValue(key, changed))
    return field
