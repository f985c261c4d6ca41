"""The panel's model box: the models the chosen repository holds, or the server serves.

Filled when the panel opens and again when the backend, the server or the repository changes, or
Find models is pressed: from the repository at once (backend local), from the server's repository
index in a napari worker (triton; auto while the server answers, else the repository). An answer
for fields changed since it was asked is dropped. Each model's one-line description (what its
weights were trained for: "light microscopy: cells and nuclei") and who publishes its weights under
which licence are its tooltip in the list, and the box's while it is the one chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

from qtpy.QtCore import Qt
from qtpy.QtWidgets import QComboBox

from ..engines import offered_models
from ..registry import MODELS
from ..repository import setup_hint
from .form import SettingsForm
from .workers import make_worker

LIST_TIMEOUT_S = 3.0  # how long the server may take to list its models


class ModelList:
    """Keeps `form`'s model box to what the backend offers; errors go to `failed`."""

    def __init__(self, form: SettingsForm, failed: Callable[[Exception], None]) -> None:
        self.form, self._failed = form, failed
        form.find_models_button.clicked.connect(self.refresh)
        form.backend_box.currentTextChanged.connect(self.refresh)
        form.url_field.editingFinished.connect(self.refresh)
        form.tls_check.toggled.connect(self.refresh)
        form.repository_changed.connect(self.refresh)
        form.model_box.currentTextChanged.connect(partial(describe_models, form.model_box))
        self.refresh()

    def _asked(self) -> tuple:
        """What a listing depends on, as the form says it now."""
        form = self.form
        return form.chosen_backend(), form.chosen_repository(), form.url_field.text(), form.tls_check.isChecked()

    def refresh(self, *_) -> None:
        """List again what the backend offers (the repository's at once, a server's in a worker)."""
        asked, form = self._asked(), self.form
        if form.chosen_backend() == "local":
            self._found(asked, offered_models("local", form.chosen_repository()))
            return
        connection = replace(form.connection(), timeout_s=LIST_TIMEOUT_S)
        worker = make_worker(offered_models, form.chosen_backend(), form.chosen_repository(), connection)
        worker.returned.connect(partial(self._found, asked))
        worker.errored.connect(partial(self._errored, asked))
        worker.start()

    def _found(self, asked: tuple, found: tuple[str, list[str]]) -> None:
        if asked != self._asked():
            return
        where, models = found
        self.form.show_models(models)
        describe_models(self.form.model_box)
        if models:
            self.form.set_status(f"{where}: {', '.join(models)}.")
        elif where.startswith("Triton"):
            self.form.set_status(f"{where} serves no triton-sam models: export them into its model repository, restart it.")
        else:
            repository = self.form.chosen_repository()
            self.form.set_status(
                f"No models exported in {repository}. {setup_hint(self.form.chosen_model(), repository)} "
                "Or choose the folder that holds them (… next to Model repository)."
            )

    def _errored(self, asked: tuple, error: Exception) -> None:
        if asked == self._asked():
            self._failed(error)


def describe_models(box: QComboBox, *_) -> None:
    """Give each model in `box` its tooltip (`tooltip`), and the box the chosen one's."""
    for index in range(box.count()):
        box.setItemData(index, tooltip(box.itemText(index)), Qt.ItemDataRole.ToolTipRole)
    box.setToolTip(tooltip(box.currentText()))


def tooltip(model_id: str) -> str:
    """What `model_id`'s weights were trained for, and their source and licence ("" if unknown)."""
    spec = MODELS.get(model_id)
    return f"{spec.description}\n{spec.source}" if spec else ""
