"""The panel's model box and model repository (issue #40 item 4) in a real napari viewer: it lists
what the repository holds or the server serves, the folder comes from a real folder chooser, and
the choice is remembered."""

from __future__ import annotations

import pytest

from synthetic import write_repository
from triton_sam.registry import DEFAULT_MODEL, get_model

napari = pytest.importorskip("napari")
from process_scenarios import open_section  # noqa: E402
from qtpy.QtCore import Qt, QTimer  # noqa: E402
from qtpy.QtTest import QTest  # noqa: E402
from qtpy.QtWidgets import QApplication, QFileDialog  # noqa: E402

from triton_sam.plugin.widget import TritonSamWidget  # noqa: E402
from triton_sam.repository import ENV_MODEL_REPOSITORY  # noqa: E402

SMALL = get_model("sam2.1_hiera_small")


def _listed(widget) -> list[str]:
    box = widget.form.model_box
    return [box.itemText(i) for i in range(box.count())]


def _status(widget) -> str:
    return widget.form.status.label.text()


def choose_folder(qtbot, widget, folder) -> None:
    """Press "…" and choose `folder` in the folder chooser it opens."""
    answered = []

    def answer() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QFileDialog):
            QTimer.singleShot(50, answer)
            return
        dialog.focusWidget().clearFocus()  # selectFile leaves the file name field as it is while it has focus
        dialog.setDirectory(str(folder))
        dialog.selectFile(str(folder))
        dialog.accept()
        answered.append(dialog.windowTitle())

    open_section(widget, "settings")
    QTimer.singleShot(50, answer)
    QTest.mouseClick(widget.form.repository_button, Qt.MouseButton.LeftButton)
    assert answered == ["Model repository"]


def test_the_model_box_lists_the_chosen_repository_s_models_and_the_folder_is_remembered(
    qtbot, viewer, synthetic_repository, tmp_path, monkeypatch
):
    monkeypatch.delenv(ENV_MODEL_REPOSITORY, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # the user's own repository: empty
    monkeypatch.chdir(tmp_path)
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.backend_box.setCurrentText("Local")
    users = tmp_path / "data" / "triton-sam" / "model_repository"
    assert widget.form.repository_field.text() == str(users)
    assert _listed(widget) == [DEFAULT_MODEL]  # nothing exported: the choice stays, and the status says how to export it
    assert _status(widget).startswith(f"No models exported in {users}. Run `triton-sam setup {DEFAULT_MODEL} --output {users}`")

    choose_folder(qtbot, widget, synthetic_repository)  # the tiny model alone, not all nine
    assert widget.form.repository_field.text() == str(synthetic_repository)
    assert _listed(widget) == [DEFAULT_MODEL]
    assert _status(widget) == f"Local repository {synthetic_repository}: {DEFAULT_MODEL}."

    two = write_repository(SMALL, write_repository(get_model(DEFAULT_MODEL), tmp_path / "two"))
    widget.form.repository_field.setText(str(two))  # typed, then Enter
    QTest.keyClick(widget.form.repository_field, Qt.Key.Key_Return)
    assert _listed(widget) == [DEFAULT_MODEL, SMALL.model_id] and widget.form.model_box.currentText() == DEFAULT_MODEL

    small = write_repository(SMALL, tmp_path / "small")
    widget.form.repository_field.setText(str(small))
    QTest.keyClick(widget.form.repository_field, Qt.Key.Key_Return)
    assert _listed(widget) == [SMALL.model_id] and widget.form.model_box.currentText() == SMALL.model_id

    widget.close()
    again = TritonSamWidget(viewer)  # the next session (backend Auto, no server): the folder chosen, its models
    assert again.form.repository_field.text() == str(small)
    qtbot.waitUntil(lambda: _listed(again) == [SMALL.model_id], timeout=10000)


def test_each_model_in_the_box_says_what_its_weights_were_trained_for(qtbot, viewer, tmp_path):
    """micro-sam's fine-tunes beside a general model: each item's tooltip is its description and
    source, and the box's follows the model chosen (here with the keyboard)."""
    from dataclasses import replace

    lm = get_model("vit_b_lm")
    # The synthetic model (SAM2-shaped) under vit_b_lm's names: the box lists what the names and metadata say.
    synthetic_lm = replace(get_model(DEFAULT_MODEL), model_id=lm.model_id)
    repository = write_repository(synthetic_lm, write_repository(get_model(DEFAULT_MODEL), tmp_path / "repo"))
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.backend_box.setCurrentText("Local")
    widget.form.repository_field.setText(str(repository))
    QTest.keyClick(widget.form.repository_field, Qt.Key.Key_Return)
    box = widget.form.model_box
    assert _listed(widget) == [DEFAULT_MODEL, lm.model_id]
    tooltips = [box.itemData(i, Qt.ItemDataRole.ToolTipRole) for i in range(box.count())]
    general = "natural images, general purpose (SAM 2.1 tiny)\nMeta AI, SAM 2 (Apache-2.0)"
    microscopy = "light microscopy: cells and nuclei\nmicro-sam, bioimage.io model diplomatic-bug (CC-BY-4.0)"
    assert tooltips == [general, microscopy] and box.toolTip() == general
    box.setFocus()
    QTest.keyClick(box, Qt.Key.Key_Down)
    assert box.currentText() == lm.model_id and box.toolTip() == microscopy
