"""The triton-sam dock widget's lifecycle: engine, session, controllers, and closing.

Thin on purpose: models, caching and scheduling live in the Qt-free core (`InteractiveSession`).
The widget holds its form (`form.SettingsForm`) and wires controllers, as napari panels wire
layers: `encoding.PlaneEncoding` encodes planes, `interaction.Interaction` is what mouse and keys
(`bindings`) act on, `propagation`, `automatic` and `series_panel` run Propagate, Segment all
and a series of images (which `start_on` starts on, image by image). Encoding and
connecting run in napari thread workers; previews arrive on a worker thread and are moved to the
GUI thread before they touch a layer.
"""

from __future__ import annotations

import weakref
from functools import partial

import napari
from napari.layers import Image
from napari.utils.theme import get_theme
from qtpy.QtCore import QEvent, QSignalBlocker, QTimer, Signal
from qtpy.QtWidgets import QVBoxLayout, QWidget
from superqt.utils import ensure_main_thread

from ..errors import InvalidInputError, ServerBusyError, ServerUnavailableError
from ..features import FeatureCache, default_disk_dir
from ..session import UNDECODED, InteractiveSession
from . import bindings, layers
from . import preview as previews
from .automatic import AutomaticSegmentation
from .encoding import PlaneEncoding
from .find import ConceptFinder, create_engine
from .form import SettingsForm
from .interaction import Interaction
from .keys import KeyChoice
from .model_list import ModelList
from .propagation import LabelPropagation
from .series_panel import SeriesPanel
from .workers import make_worker

THREE_D_STATUS = "3D view: SAM works on 2D planes. Switch back to 2D (the viewer's 2D/3D button) to hover, click and commit."
IMAGE_REMOVED = "The image layer was removed: choose a layer and press Start."
READY = "Ready: hover to preview, click to add a point, {commit} to commit."
NOT_ANSWERING = "Server not answering: your prompts are kept. Move the mouse once it answers to preview them again."
NOT_DECODED = "The decode failed: your prompts are kept."


class TritonSamWidget(QWidget):
    """Dock widget: choose backend, server and model; hover to preview, click to prompt, keys to commit.

    It holds its form (`form`) and its controllers (`encoding`, `interaction`, Propagate and
    Segment all, whose buttons they answer); this class is the lifecycle: engine, session, Start
    and Encode all planes, and letting go of all of it when the panel closes.
    """

    # Emitted with the `Preview` just written to the preview layer (benchmarks time event -> screen).
    preview_shown = Signal(object)

    def __init__(self, napari_viewer: napari.Viewer) -> None:
        super().__init__()
        self.viewer = napari_viewer
        self.form = SettingsForm()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.form)
        self.encoding = PlaneEncoding(
            napari_viewer,
            self,
            set_status=self.form.set_status,
            say_ready=self.say_ready,
            failed=self._failed,
            on_leaving=lambda: (self.interaction.leave_plane(), self.finder.clear()),
            on_shown=lambda: (self.interaction.plane_shown(), self.series.plane_shown()),
            on_all_finished=self._encode_all_finished,
            on_new_pixels=self._on_new_pixels,
            on_renamed=self._refresh_layers,
        )
        self.series = SeriesPanel(napari_viewer, self.form, self.encoding, self.start_on)
        self.form.add_section("Series (a folder of images)", self.series.group, "series")
        self.interaction = Interaction(
            napari_viewer,
            self.encoding,
            switched_on=self.form.interaction_check.isChecked,
            out_of_step=self.out_of_step,
            set_status=self.form.set_status,
            failed=self._failed,
            on_preview_shown=self.preview_shown.emit,
            show_telemetry=self._previewed,
            news_over=self._news_over,
            on_committed=self.series.committed,
        )
        self._automatic = AutomaticSegmentation(napari_viewer, self.encoding, self.form, self.series.objects_of)
        self.finder = ConceptFinder(napari_viewer, self.encoding, self.form, self._failed, self._automatic)  # (its own section)
        self.interaction.find = self.finder
        self._chosen: Image | None = None  # the image layer being started on
        self._said_out_of_step: str | None = None  # what the status says of the panel's choice vs the session
        self._closed = False
        self._starting: InteractiveSession | None = None  # made at Start, until its layers are
        self._key_actions: KeyChoice | None = None  # the keys bound (the panel's Keys choice)
        self._propagation = LabelPropagation(
            napari_viewer,
            self.encoding,
            self.form,
            on_finished=lambda: self._enable_stack_controls(self.form.image_box.currentText()),
        )
        self._on_move = partial(bindings.hover, self.interaction)
        self._on_press = partial(bindings.press, self.interaction)
        self.form.start_button.clicked.connect(self.connect_engine)
        self.form.encode_all_button.clicked.connect(self.toggle_encode_all)
        self.form.propagate_button.clicked.connect(self._propagation.toggle)
        self.form.segment_all_button.clicked.connect(self._automatic.toggle)
        self.form.interaction_check.toggled.connect(lambda on: on or self.interaction.leave())
        self.form.image_box.currentTextChanged.connect(self._enable_stack_controls)
        self.form.image_box.currentTextChanged.connect(self._choice_changed)
        self.form.model_box.currentTextChanged.connect(self._choice_changed)
        self.models = ModelList(self.form, self._failed)  # the model box: what the repository or server offers
        # napari deletes docked widgets with its window without closing them, and may keep their
        # Python side alive: the engine goes when the Qt side does.
        self.destroyed.connect(partial(_let_go_of, weakref.ref(self)))
        self._hook()
        self._theme_changed()
        self._refresh_layers()
        layers.import_for_labels()

    def _hook(self) -> None:
        """Follow the viewer: mouse, sliders, layer list, keys."""
        self.viewer.mouse_move_callbacks.append(self._on_move)
        self.viewer.mouse_drag_callbacks.append(self._on_press)
        self.viewer.dims.events.current_step.connect(self.encoding.step_moved)
        self.viewer.dims.events.ndisplay.connect(self._on_ndisplay)
        self.viewer.events.mouse_over_canvas.connect(self.interaction.canvas_crossed)
        self.viewer.events.theme.connect(self._theme_changed)
        bindings.camera(self.viewer).events.center.connect(self.encoding.view_moved)
        bindings.camera(self.viewer).events.zoom.connect(self.encoding.view_moved)
        bindings.camera(self.viewer).events.zoom.connect(self.interaction.zoomed)
        self.viewer.layers.events.inserted.connect(self._refresh_layers)
        self.viewer.layers.events.removed.connect(self._refresh_layers)
        self._key_actions = KeyChoice(self.viewer, self.interaction, self.form, self.series)

    def _unhook(self) -> None:
        """Stop following the viewer (the panel was closed): no callback of ours may outlive it."""
        for callbacks, callback in (
            (self.viewer.mouse_move_callbacks, self._on_move),
            (self.viewer.mouse_drag_callbacks, self._on_press),
        ):
            if callback in callbacks:
                callbacks.remove(callback)
        self.viewer.dims.events.current_step.disconnect(self.encoding.step_moved)
        self.viewer.dims.events.ndisplay.disconnect(self._on_ndisplay)
        self.viewer.events.mouse_over_canvas.disconnect(self.interaction.canvas_crossed)
        self.viewer.events.theme.disconnect(self._theme_changed)
        bindings.camera(self.viewer).events.center.disconnect(self.encoding.view_moved)
        bindings.camera(self.viewer).events.zoom.disconnect(self.encoding.view_moved)
        bindings.camera(self.viewer).events.zoom.disconnect(self.interaction.zoomed)
        self.viewer.layers.events.inserted.disconnect(self._refresh_layers)
        self.viewer.layers.events.removed.disconnect(self._refresh_layers)
        self._key_actions.close()
        self._key_actions = None

    # --- layers and models ----------------------------------------------------------------------

    def _refresh_layers(self, event=None) -> None:
        if self.session is not None and self.image is not None and self.image not in self.viewer.layers:
            # Only state changes here: napari may be tearing its layers down (viewer closing).
            self.encoding.index = None  # not ready: moves, clicks and keys are ignored, late previews dropped
            self.form.set_status(IMAGE_REMOVED)
        current = self.form.image_box.currentText()
        names = [layer.name for layer in self.viewer.layers if isinstance(layer, Image)]
        started_on = self.image.name if self.session is not None and self.image is not None else None
        active = getattr(self.viewer.layers.selection.active, "name", None)
        preferred = next((name for name in (current, started_on, active) if name in names), None)
        with QSignalBlocker(self.form.image_box):  # the box passes through other names while it is filled
            self.form.image_box.clear()
            self.form.image_box.addItems(names)
            if preferred is not None:
                self.form.image_box.setCurrentText(preferred)
        if self.form.image_box.currentText() != current:
            self.form.image_box.currentTextChanged.emit(self.form.image_box.currentText())

    # --- engine and planes ----------------------------------------------------------------------

    def connect_engine(self) -> None:
        """Create the engine (off the GUI thread), then encode the plane on screen."""
        if self.form.image_box.currentText() not in self.viewer.layers:
            self.form.set_status("Add an image layer first.")
            return
        self.form.save_settings()
        self._closed = False
        self._chosen = self.viewer.layers[self.form.image_box.currentText()]
        backend = self.form.chosen_backend()
        self.form.set_status(f"Connecting ({backend}) ...")
        self.form.start_button.setEnabled(False)
        worker = make_worker(
            create_engine, self.form.chosen_model(), backend, self.form.chosen_repository(), self.form.connection()
        )
        worker.returned.connect(self._engine_ready)
        worker.errored.connect(self._failed)
        worker.finished.connect(lambda: self.form.start_button.setEnabled(True))
        worker.start()

    def _engine_ready(self, engine) -> None:
        if self._closed:  # the widget was closed while connecting
            engine.close()
            return
        if self._chosen not in self.viewer.layers:
            engine.close()
            self.form.set_status(IMAGE_REMOVED)
            return
        self.close_session()
        self._closed = False
        disk_dir = default_disk_dir() if self.form.disk_cache_check.isChecked() else None
        try:
            cache = FeatureCache(engine, disk_dir=disk_dir)
        except InvalidInputError as error:  # $TRITON_SAM_DISK_CACHE_GB
            engine.close()
            self._failed(error)
            return
        self._prepare(InteractiveSession(engine, self.interaction.preview_ready, cache=cache, on_error=self._decode_failed))

    def start_on(self, image: Image) -> None:
        """Start on `image` (a series' image), going on with the session running the model shown (and its
        features cache: the image may be encoded already) if there is one."""
        self.form.image_box.setCurrentText(image.name)
        session = self.session
        if session is None or session.spec.model_id != self.form.model_box.currentText():
            self.connect_engine()
            return
        self._chosen = image
        self.encoding.follow(None)
        self.encoding.begin(session, image)  # from now on nothing acts on the image before (its prompts go at its first plane)
        session.next_object_id = layers.next_object_id(self.viewer, image)  # (its plane may be ready before the prompt layers)
        self._prepare(session)

    def _prepare(self, session: InteractiveSession) -> None:
        """Start's preview layer for the chosen image, then (a turn of the event loop later) the rest."""
        large = session.is_tiled(layers.plane_shape(self._chosen))
        layer = layers.preview_layer(self.viewer, self._chosen, window=large)
        zoom = bindings.camera(self.viewer).zoom
        self.interaction.preview = previews.WindowPreview(layer, zoom) if large else previews.LivePreview(layer, zoom)
        # napari takes ~0.1 s for each new layer: the prompt layers come a turn of the event loop
        # later, so that the window is not frozen for all of them at once (a timer, not 0 ms: Qt
        # runs a 0-ms single shot with the posted events, before input and other timers).
        self._starting = session
        QTimer.singleShot(1, partial(self._session_ready, session))

    def _session_ready(self, session: InteractiveSession) -> None:
        """Start's second half: the prompt layers, then the plane on screen is encoded."""
        if self._starting is not session:  # the panel was closed, or started anew, meanwhile
            return
        self._starting = None
        if self._chosen not in self.viewer.layers:
            session.close()
            self.form.set_status(IMAGE_REMOVED)
            return
        if (self.encoding.session, self.encoding.image) != (session, self._chosen):  # (`start_on` began: its plane may be shown)
            self.encoding.begin(session, self._chosen)
        self._said_out_of_step = None
        interaction = self.interaction
        interaction.prompts, interaction.box = layers.prompt_layers(self.viewer, self.image, above=interaction.preview.layer)
        self.session.next_object_id = layers.next_object_id(self.viewer, self.image)
        self.viewer.layers.selection.active = self.image
        self.encoding.follow(self.image)
        self.form.status.show_engine(session.engine.describe())
        self.encoding.step_moved()

    def out_of_step(self) -> str | None:
        """Why mouse and keys rest while the panel shows another image or model than the session's
        (None when it shows what runs): a prompt is never given on one image and decoded on another."""
        session, image = self.session, self.image
        if session is None or image not in self.viewer.layers:  # (a removed image has its own message)
            return None
        shown_image, shown_model = self.form.image_box.currentText(), self.form.model_box.currentText()
        if shown_image == image.name and shown_model == session.spec.model_id:
            return None
        return (
            f"The panel shows {shown_image or 'no image'} with {shown_model}, but {image.name} is being segmented "
            f"with {session.spec.model_id}: press Start to segment what the panel shows (mouse and keys rest until then), "
            "or choose them again."
        )

    def _choice_changed(self, text: str = "") -> None:
        """Another image or model chosen in the panel: its preview goes and mouse and keys rest until
        Start (or until the session's own are chosen again); the status says which."""
        why = self.out_of_step()
        if why == self._said_out_of_step:
            return
        self._said_out_of_step = why
        if why is not None:
            self.session.leave()
            self.interaction.clear_preview()
            self.form.set_status(why)
        elif self.session is not None:
            self.say_ready()
            self.interaction.preview_at_cursor()

    def _enable_stack_controls(self, name: str = "") -> None:
        """The stack's buttons only for a layer with planes to go through (3D or more, colour aside)."""
        layer = self.viewer.layers[name] if name in self.viewer.layers else None
        stacked = isinstance(layer, Image) and layer.ndim > 2
        self.form.stacks_group.setEnabled(stacked or self._propagation.running or self.encoding.encoding_all)  # can stop
        self.form.stacks_group.setToolTip("" if stacked else "For a stack of planes (z or t): choose a 3D or higher image layer.")
        self.form.all_planes_check.setEnabled(stacked)  # (a 2D image has one plane)

    @ensure_main_thread
    def _failed(self, error: Exception) -> None:
        """An error, whole (it says what to do), in the warning colour; one of the server's passes
        once a preview shows again."""
        trouble = isinstance(error, (ServerUnavailableError, ServerBusyError)) or str(error) == UNDECODED
        self.form.status.warn(f"Error: {error}", engine_trouble=trouble)

    @ensure_main_thread
    def _decode_failed(self, error: Exception) -> None:
        """A decode failed (the session's `on_error`): with an object in progress, the status says
        first that its prompts are kept (the next move decodes them again)."""
        session = self.session
        if session is None or session.object.empty:
            self.form.status.warn(f"Error: {error}", engine_trouble=True)
            return
        headline = NOT_ANSWERING if isinstance(error, ServerUnavailableError) else NOT_DECODED
        self.form.status.warn(f"{headline}\n{error}", engine_trouble=True)

    def _previewed(self, figures: str) -> None:
        """A preview was shown: its `figures` (latency, moves previewed) go to the status's tooltip,
        the engine label follows the engine (Auto may have gone local), and an error of the engine is over."""
        status = self.form.status
        status.set_figure("preview", figures)
        status.show_engine(self.session.engine.describe())
        if status.engine_trouble:
            self.say_ready()

    def _news_over(self, text: str) -> None:
        """News of the object ("candidate 2 of 3") no longer holds: if the status still says it, how to segment."""
        if self.form.status.shows(text):
            self.say_ready()

    def _theme_changed(self, event=None) -> None:
        """Errors are shown in the warning colour of the viewer's theme."""
        self.form.status.set_warning_colour(get_theme(self.viewer.theme).warning.as_hex())

    def _on_new_pixels(self, same_layout: bool) -> None:
        """The layer's data was replaced (a filter, a plugin): propagating and Segment all, which
        read the old planes, stop; data of another shape needs Start (the panel's layers have the old one)."""
        self._propagation.image_changed(self.image)
        self._automatic.stop("the image's data changed")
        if not same_layout:
            self.close_session()
            self.form.set_status("The image layer's data changed shape: press Start to segment it.")

    @property
    def session(self) -> InteractiveSession | None:
        """The session started (None before Start and once closed)."""
        return self.encoding.session

    @property
    def image(self) -> Image | None:
        """The image layer the session was started on."""
        return self.encoding.image

    @property
    def tiled(self) -> bool:
        """The plane on screen is large: covered by tiles, encoded as they come into view."""
        return self.encoding.tiled

    def toggle_encode_all(self) -> None:
        """Encode every plane of the layer in the background (with progress); of large planes, the
        tiles in view now (the same region of every plane). Pressed again, stop."""
        if self.encoding.encoding_all:
            self.encoding.stop_all()
            return
        if self.session is None:
            self.form.set_status("Press Start first.")
            return
        self.encoding.encode_all()
        self.form.encode_all_button.setText("Stop encoding")

    def _encode_all_finished(self) -> None:
        self.form.encode_all_button.setText("Encode all planes")
        self._enable_stack_controls(self.form.image_box.currentText())

    @property
    def ready(self) -> bool:
        """A plane is encoded and it is the one on screen."""
        return self.encoding.ready

    # --- the view and the switch ---------------------------------------------------------------

    def _on_ndisplay(self, event=None) -> None:
        """3D view: say that SAM works on 2D planes (mouse and keys rest until 2D is back)."""
        if self.session is None:
            return
        if self.viewer.dims.ndisplay == 3:
            self.session.leave()
        self.say_ready()

    def say_ready(self, news: str = "", figures: str = "") -> None:
        """The plane on screen is ready (the status says how to segment, and if the disk cache cannot
        be written, that features stay in memory), or `news` of its encoding came; `figures` (how long
        it took) go to the tooltip, the engine to its label. In 3D view the 3D hint stays (work may
        finish after the switch)."""
        ready = READY.format(**self.form.keys)
        if self.session is not None:
            self.form.status.show_engine(self.session.engine.describe())
            ready = "\n".join(filter(None, [ready, self.session.cache.disk_error]))  # (a folder that cannot be written)
        if figures:
            self.form.status.set_figure("encoding", figures)
        self.form.set_status(THREE_D_STATUS if self.viewer.dims.ndisplay == 3 else news or ready)

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self._detach()
        super().closeEvent(event)

    def event(self, event) -> bool:
        # napari's close button takes the widget out of its dock (parent None) without closing it.
        if event.type() == QEvent.Type.ParentChange and self.parent() is None and self._key_actions:
            self._detach()
        return super().event(event)

    def _detach(self) -> None:
        self.series.saving.flush()  # (the edits of the last moment: saved, not waiting for a timer that goes with the panel)
        self.close_session()
        if self._key_actions:
            self._unhook()

    def close_session(self) -> None:
        """Stop decoding and let go of the engine; results still in flight are ignored, the preview is cleared."""
        self.encoding.follow(None)
        self._let_go()
        self.interaction.clear_preview()
        self.finder.clear()
        self.form.status.show_engine(None)

    def _let_go(self) -> None:
        """Stop all work and drop the engine, in Python only (also when the Qt side is already deleted)."""
        self._closed = True
        if self._starting is not None:
            self._starting.close()
            self._starting = None
        self._propagation.close()
        self._automatic.stop()
        self.finder.end()
        if (session := self.encoding.end()) is not None:
            session.close()


def _let_go_of(widget: weakref.ref[TritonSamWidget]) -> None:
    if (alive := widget()) is not None:
        alive._let_go()
