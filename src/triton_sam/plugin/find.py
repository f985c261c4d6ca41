"""The panel's "Find" section: every instance of a phrase on the plane on screen (SAM3's concepts).

A phrase and Enter run `concepts.ConceptProcessor` on the plane's features, from the session's own
cache (one encode serves hover, clicks and Find), in a worker; the instances scoring above the
slider's threshold are shown in the found layer, each in its own colour. The slider re-filters the
last detection (no detector run); while Find shows a phrase's result, a box dragged with the box
modifier adds an exemplar (with the negative modifier too: "not this") and finds again; the commit
key writes every instance shown as a new object (one undo step, never over labels). Runs on the
local backend, for a sam3_tracker export with its concept graphs, or on a Triton server whose
session model has them (it runs the detector next to the features it keeps). On a stack, "Find on all planes"
finds the phrase on every plane into a new labels layer, as Segment all on all planes does (its
progress bar, stop, one undo step; `automatic_concepts`). On a large (tiled) plane, Enter finds the
phrase in the tiles in view, each at native resolution, into a new labels layer as Segment all on the
visible region does (no preview there: the slider and exemplar boxes act on planes encoded whole).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

import napari
import numpy as np
from qtpy.QtCore import Qt
from qtpy.QtWidgets import QGridLayout, QLabel, QLineEdit, QPushButton, QSlider, QWidget

from .. import engines
from ..concepts import ConceptProcessor
from ..concepts.instances import label_image, labelled_already
from ..errors import ModelFileError, ModelNotFoundError, TritonSamError
from ..registry import ModelSpec
from ..repository import concepts_path, locate
from . import layers
from .automatic import PLANE, VIEW, AutomaticSegmentation, too_many_tiles
from .automatic_concepts import ConceptSearch
from .encoding import MAX_VIEW_TILES, NOT_READY, PlaneEncoding
from .form import SettingsForm
from .workers import make_worker

DEFAULT_SCORE = 0.5  # sam3's confidence threshold
NEEDS_SAM3 = "Find needs SAM 3: choose sam3_tracker (exported with its concept graphs) and press Start."
NO_DETECTOR = (
    "Find runs on a Triton server or on the Local backend (an export with its concept graphs), and this engine "
    "is neither: choose Triton or Local and press Start."
)
NO_GRAPHS = (
    "This sam3_tracker export has no concept graphs (text encoder, detector) in {path}: export it again without "
    "--no-concepts (`triton-sam export sam3_tracker --checkpoint sam3.pt`), then press Start."
)
OLD_ENCODER = "This sam3_tracker encoder does not answer SAM 3's detector maps: export sam3_tracker again, then press Start."
ALL_PLANES, STOP = "Find on all planes", "Stop finding"
NO_PHRASE = "Type a phrase first (e.g. nucleus): Enter finds it on this plane, '{button}' on every plane."
NOT_A_STACK = "This image is one plane: Enter in the Find field finds the phrase on it."
SEGMENTING = "Segment all (or Find on a large plane or all planes) is running: stop it first."


def create_engine(spec: ModelSpec, backend: str, repository, connection) -> engines.Engine:
    """`engines.create_engine`, the local engine keeping SAM3's detector maps where Find can run
    there: an export with its concept graphs, on the local backend or as Auto's fallback (an
    encoder without the maps: Find says so)."""
    if backend in ("local", "auto") and spec.family == "sam3":
        try:
            if locate(spec, repository).concepts_dir is not None:
                return engines.create_engine(spec, backend, repository, connection=connection, detector_maps=True)
        except (ModelNotFoundError, ModelFileError, TritonSamError):
            pass  # as the engine without the maps says, or Find
    return engines.create_engine(spec, backend, repository, connection=connection)


def unavailable(session) -> str | None:
    """Why Find cannot run with `session`'s engine (None: it can; a server without concept graphs
    says so when asked)."""
    engine = session.engine
    if session.spec.family != "sam3":
        return NEEDS_SAM3
    if engine.detector_maps or engine.answers_concepts:
        return None
    exported = getattr(engine, "exported", None)
    if exported is None:
        return NO_DETECTOR
    if exported.concepts_dir is None:
        return NO_GRAPHS.format(path=concepts_path(exported.encoder.parents[2], session.spec))
    return OLD_ENCODER


def _processor(session) -> ConceptProcessor:
    """A concept processor on `session`'s engine and cache (its planes encoded once for hover and
    Find): with the export's concept graphs locally, with the server's through Triton."""
    exported = getattr(session.engine, "exported", None)
    concepts_dir = exported.concepts_dir if exported is not None and session.engine.detector_maps else None
    return ConceptProcessor(session.engine, concepts_dir, cache=session.cache)


def _refilter(processor: ConceptProcessor, state: dict) -> None:
    """The last detection filtered again at the processor's threshold (no detector run)."""
    processor.set_confidence_threshold(processor.confidence_threshold, state)


class Found(NamedTuple):
    """A Find run's answer: the instances above the threshold as a label image (ids by score)."""

    run: int  # which run of the finder (only the last one's is shown)
    plane: tuple[int, ...]
    labels: np.ndarray
    scores: np.ndarray
    masks: np.ndarray  # bool [N, 1, H, W], for the commit (never over labels)
    known: int  # instances labelled already when the run began (a commit leaves them out)


class ConceptFinder:
    """The Find section's fields (`group`, a section of `form`) and what they, the commit key and a
    modifier's box do. `encoding` holds the session and the plane on screen; the form's status says
    what Find does, `failed` an error; `automatic` runs Find on all planes (as Segment all).
    """

    def __init__(
        self,
        viewer: napari.Viewer,
        encoding: PlaneEncoding,
        form: SettingsForm,
        failed: Callable[[Exception], None],
        automatic: AutomaticSegmentation,
    ) -> None:
        self.viewer, self.encoding, self.form, self.automatic = viewer, encoding, form, automatic
        self._set_status, self._failed = form.set_status, failed
        self.phrase_field = QLineEdit(placeholderText="a phrase, e.g. nucleus; Enter finds")
        self.score_slider = QSlider(Qt.Orientation.Horizontal, minimum=0, maximum=100, singleStep=1, pageStep=5)
        self.score_slider.setValue(round(DEFAULT_SCORE * 100))
        self.score_slider.setTracking(False)  # a drag re-filters once, where it is let go
        self.score_label = QLabel(f"{DEFAULT_SCORE:.2f}")
        self.all_planes_button = QPushButton(ALL_PLANES)
        self.all_planes_button.setToolTip(
            "On a stack: find the phrase on every plane (instances above the score) into a new labels layer; "
            "pressed again, stop (the planes done stay)"
        )
        self.group = QWidget()
        grid = QGridLayout(self.group)
        grid.addWidget(QLabel("Find"), 0, 0)
        grid.addWidget(self.phrase_field, 0, 1, 1, 2)
        grid.addWidget(QLabel("Score"), 1, 0)
        grid.addWidget(self.score_slider, 1, 1)
        grid.addWidget(self.score_label, 1, 2)
        grid.addWidget(self.all_planes_button, 2, 1, 1, 2)
        self.group.setToolTip(
            "Every instance of a phrase on the plane (SAM 3). Ctrl-drag a box: more like this; "
            "Ctrl-Alt-drag: not this. The commit key commits all shown; Enter in an empty field clears."
        )
        form.add_section("Find (SAM 3 concepts)", self.group, "find")
        self.phrase_field.returnPressed.connect(self.find)
        self.score_slider.valueChanged.connect(self._threshold_moved)
        self.all_planes_button.clicked.connect(self.find_on_all_planes)
        self.layer = None
        self.shown: Found | None = None
        self._processor: ConceptProcessor | None = None
        self._state: dict | None = None  # the processor's state of the plane found on (worker threads, under the lock)
        self._lock = threading.Lock()
        self._runs = 0
        self._phrase, self._exemplars, self._plane = "", [], None  # what is shown was found with, where

    @property
    def threshold(self) -> float:
        """The slider's score threshold (0..1): instances scoring above it are shown."""
        return self.score_slider.value() / 100

    @property
    def active(self) -> bool:
        """A phrase was found on the plane on screen: boxes are exemplars, the commit key commits its instances."""
        return self._plane is not None and self._plane == self.encoding.index and self.encoding.ready

    @property
    def detector_runs(self) -> int:
        """Detector runs of the session's processor (the slider adds none)."""
        return self._processor.detector_runs if self._processor is not None else 0

    def find(self) -> None:
        """Enter: find the phrase's instances on the plane on screen (an empty field clears Find)."""
        phrase = self.phrase_field.text().strip()
        if not phrase:
            self.clear()
            return
        session = self.encoding.session
        if not self._can_run():
            return
        if self.encoding.large:
            self._find_in_view(phrase)
            return
        image, index = self.encoding.image, self.encoding.index
        data, contrast = layers.plane_data(image, index), layers.encoding_contrast(image)
        self._phrase, self._exemplars, self._plane = phrase, [], index
        self._set_status(f"Finding '{phrase}' ...")

        def detect(processor: ConceptProcessor, state: dict) -> None:
            processor.set_image(np.asarray(data), state, contrast)
            processor.reset_all_prompts(state)
            processor.set_text_prompt(phrase, state)

        self._run(session, index, detect, fresh=True)

    def _find_in_view(self, phrase: str) -> None:
        """On a large plane: the phrase's instances in the tiles in view, each tile at native
        resolution, joined into a new labels layer as Segment all on the visible region makes it."""
        tiles = self.automatic.view_tiles()
        if self.automatic.running or len(tiles) > MAX_VIEW_TILES:
            self._set_status(SEGMENTING if self.automatic.running else too_many_tiles(len(tiles)))
            return
        self.clear()
        search = ConceptSearch(_processor(self.encoding.session), phrase, self.threshold)
        self.automatic.start(self.encoding.image, self.encoding.index, VIEW, search, tiles)
        self.automatic.shown_on(self.all_planes_button, STOP, ALL_PLANES)

    def find_on_all_planes(self) -> None:
        """The all-planes button: find the phrase on every plane of the stack into a new labels layer
        (Segment all's run on all planes: progress bar, stop, planes done kept); pressed again, stop."""
        if self.automatic.running:
            self.automatic.stop() if self.automatic.started_by(self.all_planes_button) else self._set_status(SEGMENTING)
            return
        phrase = self.phrase_field.text().strip()
        if not phrase:
            self._set_status(NO_PHRASE.format(button=ALL_PLANES))
            return
        if not self._can_run():
            return
        image = self.encoding.image
        if image.ndim <= 2:
            self._set_status(NOT_A_STACK)
            return
        tiles = self.automatic.view_tiles() if self.encoding.large else None
        if tiles is not None and len(tiles) > MAX_VIEW_TILES:
            self._set_status(too_many_tiles(len(tiles)))
            return
        self.clear()  # the plane's preview goes: the run's layer shows every plane
        search = ConceptSearch(_processor(self.encoding.session), phrase, self.threshold)
        self.automatic.start_stack(image, VIEW if tiles else PLANE, search, tiles)
        self.automatic.shown_on(self.all_planes_button, STOP, ALL_PLANES)

    def _can_run(self) -> bool:
        """Whether Find can run on the plane on screen (else the status says why not)."""
        why = NOT_READY if not self.encoding.ready else unavailable(self.encoding.session)
        if why is not None:
            self._set_status(why)
        return why is None

    def add_exemplar(self, x0: float, y0: float, x1: float, y1: float, positive: bool) -> None:
        """A box dragged while Find shows a phrase's result: "more like this" (or "not this"), found again."""
        height, width = layers.plane_shape(self.encoding.image)
        (x0, x1), (y0, y1) = sorted((x0, x1)), sorted((y0, y1))
        box = ((x0 + x1) / 2 / width, (y0 + y1) / 2 / height, (x1 - x0) / width, (y1 - y0) / height)
        self._exemplars.append([x0, y0, x1, y1, positive])
        self._set_status(f"Finding '{self._phrase}' with {len(self._exemplars)} exemplar boxes ...")
        self._run(
            self.encoding.session, self._plane, lambda processor, state: processor.add_geometric_prompt(box, positive, state)
        )

    def _threshold_moved(self, value: int) -> None:
        """The slider moved: the last detection re-filtered (no detector run)."""
        self.score_label.setText(f"{self.threshold:.2f}")
        if self.active:
            self._run(self.encoding.session, self._plane, _refilter)

    def _run(
        self, session, plane: tuple[int, ...], change: Callable[[ConceptProcessor, dict], None], fresh: bool = False
    ) -> None:
        """`change` the processor's state in a worker (runs one at a time, in order), then show the
        instances above the slider's threshold if this run is still the last one asked for."""
        self._runs += 1
        run, threshold = self._runs, self.threshold
        objects = layers.existing_objects_layer(self.viewer, self.encoding.image)
        labelled = None if objects is None else np.asarray(objects.data[plane]) != 0  # as the run begins

        def work() -> Found:
            with self._lock:
                if self._processor is None or self._processor.engine is not session.engine:
                    self._processor = _processor(session)
                if fresh or self._state is None:
                    self._state = {}
                processor, state = self._processor, self._state
                processor.set_confidence_threshold(threshold)  # what `change` keeps (a detection filters once)
                change(processor, state)
                masks, scores = state["masks"], state["scores"]
            flat = masks.reshape(len(masks), *masks.shape[-2:])  # [N, H, W], as `label_image` reads them
            known = 0 if labelled is None else sum(labelled_already(mask, labelled) for mask in flat)
            return Found(run, plane, label_image(masks, scores), scores, masks, known)

        worker = make_worker(work)
        worker.returned.connect(self._show)
        worker.errored.connect(self._failed)
        worker.start()

    def _show(self, found: Found) -> None:
        """Show `found` in the found layer if it is the last run's and its plane is still on screen;
        the engine label follows the engine (Auto may have found on its local engine)."""
        if found.run != self._runs or not self.active or found.plane != self.encoding.index:
            return
        self.form.status.show_engine(self.encoding.session.engine.describe())
        image = self.encoding.image
        self.layer = layers.found_layer(self.viewer, image, found.labels.shape)
        self.layer.data = found.labels
        self.shown = found
        exemplars = f" and {len(self._exemplars)} exemplar boxes" if self._exemplars else ""
        known = f" ({found.known} labelled already: a commit leaves them out)" if found.known else ""
        self._set_status(
            f"Found {len(found.scores)} instances of '{self._phrase}'{exemplars} scoring above {self.threshold:.2f}{known}: "
            f"{self.form.keys['commit']} commits them all; Ctrl-drag a box: more like this, Ctrl-Alt-drag: not this."
        )

    def commit(self) -> bool:
        """Write every instance shown as a new object of the objects layer (one undo step, never over
        labels), with how it was found; False when Find shows nothing to commit (the key's usual commit then)."""
        found = self.shown
        if found is None or not self.active or not len(found.scores):
            return False
        image, index, session = self.encoding.image, found.plane, self.encoding.session
        objects = layers.objects_layer(self.viewer, image, np.uint16 if self.encoding.large else np.uint32)
        labelled = np.asarray(objects.data[index]) != 0
        record = {
            "phrase": self._phrase,
            "exemplars": [list(map(float, box[:4])) + [bool(box[4])] for box in self._exemplars],
            "score_threshold": self.threshold,
            "model_id": session.spec.model_id,
            "weights_id": session.engine.weights_id,
        }
        added = layers.write_labels(objects, index, label_image(found.masks, found.scores, labelled), (0, 0), record)
        session.next_object_id = max(session.next_object_id, int(np.max(objects.data)) + 1)
        self.clear()
        self._set_status(f"{added} objects found by '{record['phrase']}' committed (Ctrl+Z on the objects layer undoes them).")
        return True

    def clear(self) -> None:
        """Find shows nothing and forgets its phrase and exemplars (runs under way are not shown)."""
        self._runs += 1
        self._phrase, self._exemplars, self._plane, self.shown = "", [], None, None
        if self.layer is not None and self.layer in self.viewer.layers:
            self.viewer.layers.remove(self.layer)
        self.layer = None

    def end(self) -> None:
        """The session ends: Find lets go of its processor (and so of the engine), in Python only
        (the viewer may be going); a run under way holds its own and is not shown."""
        self._runs += 1
        self._processor = self._state = None
