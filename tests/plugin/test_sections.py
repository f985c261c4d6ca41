"""The panel's foldable sections: on a laptop-sized window the status and the series' buttons are in
view once the Series section is unfolded, and each section stays as the user left it."""

from __future__ import annotations

import pytest

pytest.importorskip("napari")
from process_scenarios import open_section  # noqa: E402
from qtpy.QtCore import QRect  # noqa: E402

from triton_sam.plugin.widget import TritonSamWidget  # noqa: E402


def _shown_in(widget, dock) -> bool:
    """`widget` is shown whole: visible, of some size, and inside every widget it lies in up to `dock`
    (a scroll area's viewport hides what is scrolled away)."""
    if not widget.isVisible() or widget.height() == 0:
        return False
    rect = QRect(widget.mapToGlobal(widget.rect().topLeft()), widget.size())
    parent = widget.parentWidget()
    while parent is not None and parent is not dock.parentWidget():
        if not QRect(parent.mapToGlobal(parent.rect().topLeft()), parent.size()).contains(rect):
            return False
        parent = parent.parentWidget()
    return True


def test_in_a_1300_x_950_window_the_status_and_the_series_buttons_are_in_view(qtbot, viewer):
    viewer.window._qt_window.resize(1300, 950)
    dock, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.status.warn("Error: " + "a long error that wraps over several lines, with its fix " * 4)
    assert not any(section.isExpanded() for section in widget.form.sections.values())  # folded the first time
    assert not _shown_in(widget.series.buttons["next"], dock)

    open_section(widget, "series")
    qtbot.waitUntil(lambda: _shown_in(widget.form.status.label, dock), timeout=5000)
    for name, button in widget.series.buttons.items():
        assert _shown_in(button, dock), name
    for field in (widget.form.start_button, widget.form.model_box, widget.form.image_box):
        assert _shown_in(field, dock)
    widget.close_session()

    again = TritonSamWidget(viewer)  # the next session: the Series section as it was left
    assert again.form.sections["series"].isExpanded() and not again.form.sections["settings"].isExpanded()
    again.close_session()
