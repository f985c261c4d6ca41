"""The panel's model box: the models the chosen repository holds, or the server serves.

Filled when the panel opens and again when the backend, the server or the repository changes, or
Find models is pressed: from the repository at once (backend local), from the server's repository
index in a napari worker (triton; auto while the server answers, else the repository). An answer
for fields changed since it was asked is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

from ..engines import offered_models
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
