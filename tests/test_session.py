"""The interactive session on the synthetic model: real local engine, and a real Triton server."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from synthetic import ReadLog, SlowReads, disk_image, slow_encodes
from triton_sam import Predictor
from triton_sam.engines import create_engine
from triton_sam.errors import TritonSamError
from triton_sam.planes import cache_plane, cache_planes
from triton_sam.prompts import model_request
from triton_sam.registry import get_model
from triton_sam.session import InteractiveSession, ObjectInProgress
from triton_sam.tiles import Tile
from triton_sam.tiles import place as tiles_place

TINY = get_model("sam2.1_hiera_tiny")
H, W = 240, 400
IMAGE = disk_image(H, W, [(80, 80, 40), (300, 150, 50)])
OTHER = disk_image(H, W, [(200, 60, 30)])


class Previews:
    """Collects what the session shows; waits for the preview of a given condition."""

    def __init__(self) -> None:
        self.items = []
        self.cond = threading.Condition()

    def __call__(self, preview) -> None:
        with self.cond:
            self.items.append(preview)
            self.cond.notify_all()

    def wait_for(self, check, timeout_s: float = 10.0):
        with self.cond:
            assert self.cond.wait_for(lambda: self.items and check(self.items[-1]), timeout_s), self.items[-3:]
            return self.items[-1]


@pytest.fixture(params=["local", "triton"])
def engine(request, synthetic_repository):
    if request.param == "local":
        engine = create_engine(TINY, "local", synthetic_repository)
    else:
        server = request.getfixturevalue("synthetic_server")
        engine = create_engine(TINY, "triton", url=server.grpc_url)
    yield engine
    engine.close()


@pytest.fixture
def session(engine):
    previews = Previews()
    session = InteractiveSession(engine, previews, owns_engine=False)  # the engine serves the module
    session.previews = previews
    session.set_plane(("img", 0), IMAGE)
    yield session
    session.close()


def test_hover_preview_is_the_predictor_mask_for_that_point(session, synthetic_repository):
    session.hover(300, 150)
    preview = session.previews.wait_for(lambda p: p is not None and p.point == (300, 150))
    with Predictor(model_repository=synthetic_repository) as predictor:
        predictor.set_image(IMAGE)
        expected, scores, _ = predictor.predict(point_coords=[[300, 150]], point_labels=[1], multimask_output=False)
    np.testing.assert_array_equal(preview.mask, expected[0])
    assert preview.mask.shape == (H, W) and preview.mask[150, 300] and not preview.mask[80, 80]
    assert preview.score == pytest.approx(float(scores[0]))


def test_alone_the_cursor_previews_what_a_click_there_gives(exported_repository):
    """With no prompts the preview is the multimask candidate a click chooses, not the single-mask
    output (MobileSAM's is its first token: another mask); the click and its commit store it."""
    spec = get_model("mobile_sam")
    repository = exported_repository(spec.model_id)
    image = np.random.default_rng(3).integers(0, 255, (H, W, 3), np.uint8)
    previews = Previews()
    session = InteractiveSession(create_engine(spec, "local", repository), previews)
    try:
        session.set_plane(("img", 0), image)
        session.hover(200, 120)
        hovered = previews.wait_for(lambda p: p is not None and p.point == (200, 120))
        session.add_point(200, 120)
        clicked = previews.wait_for(lambda p: p is not None and p.candidate is not None)
        np.testing.assert_array_equal(clicked.mask, hovered.mask)
        np.testing.assert_array_equal(session.commit().mask, hovered.mask)
    finally:
        session.close()
    with Predictor(spec.model_id, model_repository=repository) as predictor:
        predictor.set_image(image)
        single, _, _ = predictor.predict(point_coords=[[200, 120]], point_labels=[1], multimask_output=False)
    assert hovered.mask.any() and not np.array_equal(single[0], hovered.mask)


def test_a_burst_of_moves_ends_with_the_last_position_and_sends_less(session, monkeypatch):
    decode = session.engine.decode

    def slow_decode(*args, **kwargs):  # slower than the moves come, as a real model is
        time.sleep(0.02)
        return decode(*args, **kwargs)

    monkeypatch.setattr(session.engine, "decode", slow_decode)
    for x in np.linspace(20, 380, 120):
        session.hover(float(x), 100.0)
        time.sleep(0.001)
    session.hover(80, 80)
    preview = session.previews.wait_for(lambda p: p is not None and p.point == (80, 80))
    assert preview.mask[80, 80] and not preview.mask[150, 300]
    stats = session.stats
    assert stats.events == 121 and stats.sent + stats.skipped < stats.events


def test_tiny_moves_are_skipped(session):
    session.hover(100, 100)
    session.hover(100.5, 100.5)
    assert session.stats.skipped == 1


def test_click_then_commit_returns_the_object_and_a_new_id(session):
    session.add_point(80, 80)
    preview = session.previews.wait_for(lambda p: p is not None and p.candidate is not None)
    assert preview.mask[80, 80] and not preview.mask[150, 300]
    committed = session.commit()
    assert committed.object_id == 1 and committed.plane == ("img", 0)
    np.testing.assert_array_equal(committed.mask, preview.mask)
    assert committed.provenance == {
        "points": [[80.0, 80.0]],
        "labels": [1],
        "box": None,
        "candidate": preview.candidate,
        "model_id": TINY.model_id,
        "weights_id": session.engine.weights_id,
        "mask_threshold": 0.0,
    }
    assert session.object.empty and session.next_object_id == 2
    assert session.previews.items[-1] is None  # the preview is cleared


def test_commit_right_after_a_click_waits_for_its_decode(session):
    session.add_point(300, 150)
    committed = session.commit()  # no waiting on our side: the session must not lose the click
    assert committed is not None and committed.mask[150, 300]


def test_commit_right_after_a_move_takes_the_object_moved_onto(session, monkeypatch):
    """A key pressed before the preview of the last move arrived (a remote server's latency) means
    that move: commit waits for it; it once found nothing to commit."""
    decode = session.engine.decode
    monkeypatch.setattr(session.engine, "decode", lambda *args, **kwargs: time.sleep(0.2) or decode(*args, **kwargs))
    session.hover(80, 80)
    session.hover(300, 150)
    committed = session.commit()  # no waiting on our side
    assert committed is not None and committed.mask[150, 300] and not committed.mask[80, 80]
    assert committed.provenance["points"] == [[300, 150]]


def test_commit_after_the_cursor_left_finds_nothing_at_once(session, monkeypatch):
    decode = session.engine.decode
    monkeypatch.setattr(session.engine, "decode", lambda *args, **kwargs: time.sleep(0.2) or decode(*args, **kwargs))
    session.hover(300, 150)
    session.leave()
    started = time.perf_counter()
    assert session.commit() is None
    assert time.perf_counter() - started < 2.0  # the decode it cancelled, not commit's 30-s wait


def test_commit_without_prompts_takes_the_object_under_the_cursor(session):
    session.hover(300, 150)
    session.previews.wait_for(lambda p: p is not None and p.point == (300, 150))
    committed = session.commit()
    assert committed.mask[150, 300] and not committed.mask[80, 80]
    made = committed.provenance  # the cursor was the one prompt; the single mask SAM picks
    assert (made["points"], made["labels"], made["box"], made["candidate"]) == ([[300, 150]], [1], None, None)


def test_with_prompts_the_cursor_is_a_hint_apart_and_commit_stores_what_the_preview_marks_as_the_object(
    session, synthetic_repository
):
    session.add_point(80, 80)
    clicked = session.previews.wait_for(lambda p: p is not None and p.candidate is not None)
    session.hover(300, 150)  # over the other disk: what would a click there give?
    shown = session.previews.wait_for(lambda p: p is not None and p.point == (300, 150))
    with Predictor(model_repository=synthetic_repository) as predictor:
        predictor.set_image(IMAGE)
        _, _, logits = predictor.predict(point_coords=[[80, 80]], point_labels=[1])
        both = {"point_coords": [[80, 80], [300, 150]], "point_labels": [1, 1]}
        masks, scores, _ = predictor.predict(**both, mask_input=logits[clicked.candidate][None])
    # The hint: the object with the cursor as a point too, refined from the object's mask as a click
    # there would be.
    np.testing.assert_array_equal(shown.hint, masks[np.argmax(scores)])
    assert shown.hint[150, 300] and shown.hint[80, 80]
    np.testing.assert_array_equal(shown.mask, clicked.mask)  # the object: the clicked one only
    committed = session.commit()
    np.testing.assert_array_equal(committed.mask, shown.mask)
    assert not committed.mask[150, 300] and committed.provenance["points"] == [[80.0, 80.0]]


@pytest.mark.parametrize("cursor", [(300, 150), (100, 90)], ids=["other_disk", "same_disk"])
def test_with_prompts_the_hint_is_what_a_click_at_the_cursor_gives(session, cursor):
    session.add_point(80, 80)
    first = session.previews.wait_for(lambda p: p is not None and p.candidate is not None)
    session.hover(*cursor)
    hinted = session.previews.wait_for(lambda p: p is not None and p.point == cursor and p.hint is not None)
    session.add_point(*cursor)
    clicked = session.previews.wait_for(
        lambda p: p is not None and p.point is None and p.candidate is not None and not np.array_equal(p.low_res, first.low_res)
    )
    np.testing.assert_array_equal(clicked.mask, hinted.hint)


def test_a_click_whose_decode_failed_is_decoded_again_at_the_next_move(session, monkeypatch):
    decode = session.engine.decode
    failing = threading.Event()
    failing.set()

    def flaky_decode(*args, **kwargs):
        if failing.is_set():
            raise ConnectionError("server away")
        return decode(*args, **kwargs)

    monkeypatch.setattr(session.engine, "decode", flaky_decode)
    session.add_point(300, 150)
    with pytest.raises(TritonSamError, match="prompts are kept"):  # it said "Nothing to commit"
        session.commit()
    assert session.prompts.points == [(300.0, 150.0)] and session.next_object_id == 1  # the click is kept
    failing.clear()
    session.hover(100, 200)
    session.previews.wait_for(lambda p: p is not None and p.candidate is not None and p.mask[150, 300])
    committed = session.commit()
    assert committed is not None and committed.mask[150, 300] and not committed.mask[80, 80]


def test_a_second_click_refines_the_first_clicks_mask_as_the_predictor_does(session, synthetic_repository):
    """The second click's decode gets the first's chosen logits as its mask input, clamped as
    `SAM2ImagePredictor` returns them for refinement; through Triton they come only around the
    object and are named by key, not sent again, and still refine as the whole logits do."""
    session.add_point(300, 150)
    first = session.previews.wait_for(lambda p: p is not None and p.candidate is not None)
    session.add_point(80, 80)  # the other disk: there the first mask's logits are far below -32
    # The object shows its first mask until the second click's decode replaces it.
    second = session.previews.wait_for(
        lambda p: p is not None and p.candidate is not None and not np.array_equal(p.low_res, first.low_res)
    )
    with Predictor(model_repository=synthetic_repository) as predictor:
        predictor.set_image(IMAGE)
        _, _, logits = predictor.predict(point_coords=[[300, 150]], point_labels=[1])
        _assert_equal_above_zero(TINY.as_mask_input(first.low_res), logits[first.candidate])
        raw = predictor.engine.decode(
            predictor.get_image_embedding(), model_request(TINY, (H, W), point_coords=[[300, 150]], point_labels=[1])
        )
        assert np.abs(raw.low_res_logits[0, first.candidate]).max() > 32  # the clamp matters here
        points = {"point_coords": [[300, 150], [80, 80]], "point_labels": [1, 1]}
        expected, scores, expected_logits = predictor.predict(**points, mask_input=logits[first.candidate][None])
        unrefined, _, _ = predictor.predict(**points)
    np.testing.assert_array_equal(second.mask, expected[second.candidate])
    _assert_equal_above_zero(TINY.as_mask_input(second.low_res), expected_logits[second.candidate])
    assert second.score == pytest.approx(float(scores.max()))
    assert not np.array_equal(expected, unrefined)  # the mask input made a difference
    if hasattr(session.engine, "kept_logits"):
        assert session.engine.kept_logits.keys(TINY.as_mask_input(first.low_res)[None, None]) is not None


def _assert_equal_above_zero(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Equal logits wherever either is above the mask threshold (0): a server may send a click's
    logits only around the object."""
    differs = ours != theirs
    assert (ours > 0).any() and (ours[differs] <= 0).all() and (theirs[differs] <= 0).all()


def test_cycle_candidates_undo_and_discard(session):
    session.add_point(80, 80)
    first = session.previews.wait_for(lambda p: p is not None and p.candidate is not None)
    assert first.candidate == 1  # the synthetic model scores the middle candidate best
    assert session.cycle_candidate().candidate == 2
    assert session.cycle_candidate().candidate == 0
    session.add_point(300, 150, positive=False)
    session.previews.wait_for(lambda p: p is not None and p.candidate is not None and len(session.object.points) == 2)
    assert session.undo() and session.object.points == [(80.0, 80.0)]
    assert session.undo() and session.object.empty
    assert session.previews.items[-1] is None
    assert not session.undo()
    session.add_point(80, 80)
    session.discard()
    assert session.object.empty and session.commit() is None


def test_candidates_cycle_by_score_the_best_first_and_after_the_worst_the_best_again():
    obj = ObjectInProgress(low_res=np.arange(3, dtype=np.float32).reshape(3, 1, 1), scores=np.array([0.7, 0.5, 0.9]), chosen=2)
    chosen = []
    for _ in range(4):
        obj.choose_next(lambda low_res, tile: low_res > 0)
        chosen.append(obj.chosen)
    assert obj.ranked() == [2, 0, 1] and chosen == [0, 1, 2, 0]  # by score, not by the model's order


def test_a_preview_made_before_another_candidate_was_chosen_shows_the_one_chosen(session):
    session.add_point(80, 80)
    first = session.previews.wait_for(lambda p: p is not None and p.candidate is not None)
    assert first.place == (1, 3)
    session.hover(300, 150)
    hovered = session.previews.wait_for(lambda p: p is not None and p.hint is not None)
    assert hovered.candidate == first.candidate and session.as_now(hovered) is hovered
    cycled = session.cycle_candidate()  # Shift-N while the hover's preview was on its way
    assert cycled.place == (2, 3) and cycled.candidate != first.candidate
    now = session.as_now(hovered)
    assert now.mask is cycled.mask and now.candidate == cycled.candidate and now.place == (2, 3)
    assert now.hint is hovered.hint and now.point == hovered.point and now.seq == hovered.seq  # its hint kept
    assert session.as_now(cycled) is cycled


def test_planes_keep_their_own_embedding_object_and_never_show_each_other(session):
    session.add_point(80, 80)
    session.previews.wait_for(lambda p: p is not None and p.candidate is not None)
    session.hover(200, 60)  # then the plane changes before this result may arrive
    session.set_plane(("img", 1), OTHER)
    assert session.object.empty  # plane 1 has its own object
    session.hover(200, 60)
    preview = session.previews.wait_for(lambda p: p is not None and p.plane == ("img", 1))
    assert preview.mask[60, 200]
    session.set_plane(("img", 0), IMAGE)
    assert session.object.points == [(80.0, 80.0)]  # plane 0's object is still there
    assert session.cache.hits >= 1 and len(session.cache) == 2  # plane 0 came from the cache
    shown_after_switch = [p for p in session.previews.items if p is not None]
    planes = [p.plane for p in shown_after_switch]
    assert planes.index(("img", 1)) > 0 and ("img", 0) not in planes[planes.index(("img", 1)) :]


def test_of_overlapping_plane_changes_the_last_one_begun_shows_its_plane(session, monkeypatch):
    """Scrubbing a stack: a plane still encoding (slow), then one found in the cache; the slow one
    finishing last must not take the screen back (the viewer shows the other)."""
    encoded = slow_encodes(session.engine, 0.5, monkeypatch)
    slow = threading.Thread(target=session.set_plane, args=(("img", 1), OTHER))
    slow.start()
    time.sleep(0.1)  # plane 1 is being encoded
    session.set_plane(("img", 0), IMAGE)  # cached: shown at once
    slow.join()
    assert len(encoded) == 1 and session.plane == ("img", 0)
    assert session.cache.signature(OTHER[..., None]) in session.cache  # plane 1 waits in the cache


def test_an_object_in_progress_is_decoded_afresh_when_its_plane_is_shown_with_other_contrast(session, synthetic_repository):
    """The user changes a uint16 plane's contrast limits: the plane is encoded again, and the
    object in progress is decoded from its prompts with the new features (no mask input from the
    old ones), as the predictor decodes them on the plane as now seen. Shown again as it was, the
    plane comes from the cache and the object is decoded once more."""
    plane = IMAGE.astype(np.uint16) * 10  # 200 and 2300
    key, first_limits, darker = ("uint16", 0), (0.0, 2300.0), (0.0, 9000.0)
    session.set_plane(key, plane, first_limits)
    session.add_point(300, 150)
    session.add_point(80, 80)
    first = session.previews.wait_for(lambda p: p is not None and p.candidate is not None and session.object.pending == 0)
    session.set_plane(key, plane, darker)  # the disks are grey now: not bright enough for the synthetic model
    again = session.previews.wait_for(lambda p: p is not None and p.candidate is not None and p.seq > first.seq)
    points = {"point_coords": [[300, 150], [80, 80]], "point_labels": [1, 1]}
    with Predictor(model_repository=synthetic_repository) as predictor:
        predictor.set_image(plane, darker)
        expected, scores, _ = predictor.predict(**points)
        predictor.set_image(plane, first_limits)
        expected_back, _, _ = predictor.predict(**points)
    np.testing.assert_array_equal(again.mask, expected[again.candidate])
    assert again.score == pytest.approx(float(scores.max())) and again.mask.sum() < first.mask.sum()
    encodes = session.cache.misses
    session.set_plane(key, plane, first_limits)  # back: from the cache, decoded again
    back = session.previews.wait_for(lambda p: p is not None and p.candidate is not None and p.seq > again.seq)
    np.testing.assert_array_equal(back.mask, expected_back[back.candidate])
    assert session.cache.misses == encodes and session.object.points == [(300.0, 150.0), (80.0, 80.0)]


def test_leaving_the_image_stops_hover_work(session):
    session.hover(-5, 10)
    assert session.stats.events == 0
    for x in range(20, 120, 5):
        session.hover(x, 80)
    session.leave()
    shown = len(session.previews.items)
    time.sleep(0.3)
    assert session.previews.items[shown:] == []  # nothing arrives after the cursor left
    assert session.stats.events == 20


def test_leaving_the_image_keeps_the_object_in_progress_shown_without_the_hint(session):
    """Off the image the hover's hint goes but the object its prompts make stays (it vanished
    until the cursor came back, as if the clicks were lost)."""
    session.add_point(80, 80)
    made = session.previews.wait_for(lambda p: p is not None and p.point is None and p.candidate is not None)
    session.hover(300, 150)
    session.previews.wait_for(lambda p: p is not None and p.hint is not None)  # the object, and a click there
    session.hover(-5, 10)
    left = session.previews.items[-1]
    assert left is not None and left.hint is None and left.point is None
    np.testing.assert_array_equal(left.mask, made.mask)
    session.discard()
    session.hover(300, 150)
    session.previews.wait_for(lambda p: p is not None and p.point is not None)
    session.leave()  # no object in progress: nothing is left
    assert session.previews.items[-1] is None


@pytest.mark.parametrize("owns_engine", [True, False])
def test_closing_a_session_closes_its_engine_unless_the_engine_was_lent(synthetic_repository, owns_engine):
    engine = create_engine(TINY, "local", synthetic_repository)
    closed = []
    engine.close = lambda: closed.append(engine)
    session = InteractiveSession(engine, lambda preview: None, owns_engine=owns_engine)
    session.set_plane("p", IMAGE)
    session.hover(300, 150)
    session.close()
    assert closed == ([engine] if owns_engine else []) and session.idle


# --- large planes: tiles at native resolution -------------------------------------------------

BIG_H, BIG_W = 2600, 3000  # tiled (over 2 x 1024 px): 4 x 4 tiles
BIG_DISKS = [(300, 300, 60), (1400, 896, 70), (2900, 2500, 40)]  # the second lies in an overlap
BIG = disk_image(BIG_H, BIG_W, BIG_DISKS)


def _on_plane(mask: np.ndarray, offset: tuple[int, int]) -> np.ndarray:
    plane = np.zeros((BIG_H, BIG_W), bool)
    plane[offset[0] : offset[0] + mask.shape[0], offset[1] : offset[1] + mask.shape[1]] = mask
    return plane


def _disk(x: int, y: int, r: int) -> np.ndarray:
    yy, xx = np.mgrid[:BIG_H, :BIG_W]
    return (xx - x) ** 2 + (yy - y) ** 2 <= r**2


@pytest.fixture
def big_session(session):
    session.set_plane(("big", 0), BIG)
    return session


def test_a_large_plane_is_encoded_tile_by_tile_on_request_and_hover_waits_for_its_tile(big_session, synthetic_repository):
    session = big_session
    assert len(session.tiles) == 16 and not any(session.encoded(t) for t in session.tiles)
    assert session.hover(1400, 896) is None  # its tile is not encoded: no preview, no decode
    time.sleep(0.2)
    assert not any(session.previews.items) and session.stats.sent == 0

    tile = next(t for t in session.tiles if t.x0 == 768 and t.y0 == 768)  # the tile that holds the disk best
    progress = []
    assert session.encode_tiles([tile], on_progress=lambda done, total: progress.append((done, total))) == 1
    assert progress == [(1, 1)] and session.encoded(tile) and session.encode_tiles([tile]) == 0
    session.previews.wait_for(lambda p: p is not None and p.point == (1400, 896))  # the resting cursor's, unasked
    session.hover(1404, 899)
    preview = session.previews.wait_for(lambda p: p is not None and p.point == (1404, 899))
    assert preview.offset == (768, 768) and preview.mask.shape == (1024, 1024)
    with Predictor(model_repository=synthetic_repository) as predictor:  # that tile, as an image of its own
        predictor.set_image(BIG[tile.window])
        expected, _, _ = predictor.predict(point_coords=[[1404 - 768, 899 - 768]], point_labels=[1], multimask_output=False)
    np.testing.assert_array_equal(preview.mask, expected[0])
    placed, disk = _on_plane(preview.mask, preview.offset), _disk(1400, 896, 70)
    assert placed[disk].mean() > 0.95 and placed[~disk].mean() < 0.001


def test_the_tile_under_a_waiting_cursor_is_encoded_before_the_others(big_session):
    session = big_session
    assert session.hover(2900, 2500) is None  # the far corner's disk: no tile encoded yet
    far = session.tiles[-1]
    assert session.encode_tiles(session.tiles, should_stop=lambda: session.encoded(far)) == 1  # it went first
    preview = session.previews.wait_for(lambda p: p is not None and p.point == (2900, 2500))
    assert preview.offset == far.offset


def test_tiles_go_together_to_an_engine_that_encodes_several_at_once_but_a_waited_for_one_alone(big_session, monkeypatch):
    """Where the engine encodes tiles faster together (`encode_batch`: a server batching on a GPU),
    `encode_tiles` hands them over that many at a time, encoded ones skipped; the tile under a
    cursor waiting for its preview goes first, alone."""
    session, engine = big_session, big_session.engine
    session.set_plane(("noise", 0), np.random.default_rng(0).integers(0, 256, BIG.shape, np.uint8))  # no two tiles alike
    monkeypatch.setattr(engine, "encode_batch", 3, raising=False)
    batches, encode_many = [], engine.encode_many
    monkeypatch.setattr(engine, "encode_many", lambda images: batches.append(len(images)) or encode_many(images))
    session.encode_tiles([session.tiles[1]])
    assert session.hover(2900, 2500) is None  # the far corner's tile is not encoded yet
    progress = []
    assert session.encode_tiles(session.tiles, on_progress=lambda done, total: progress.append(done)) == 15
    assert batches == [1, 1, 3, 3, 3, 3, 2]  # tile 1; the far corner's; 0, 2, 3; (1 skipped) 4-6, 7-9, 10-12, 13-14
    assert progress == [1, 4, 5, 8, 11, 14, 16] and all(session.encoded(t) for t in session.tiles)
    preview = session.previews.wait_for(lambda p: p is not None and p.point == (2900, 2500))
    assert preview.offset == session.tiles[-1].offset


def test_a_click_on_a_large_plane_encodes_its_tile_and_commit_places_the_object(big_session):
    session = big_session
    session.add_point(2900, 2500)
    committed = session.commit()
    assert committed is not None and committed.offset == (1576, 1976) and committed.mask.shape == (1024, 1024)
    placed, disk = _on_plane(committed.mask, committed.offset), _disk(2900, 2500, 40)
    assert placed[disk].mean() > 0.95 and placed[~disk].mean() < 0.001
    assert committed.provenance["tile"] == [1576, 1976, 2600, 3000] and committed.provenance["points"] == [[2900.0, 2500.0]]
    assert sum(session.encoded(t) for t in session.tiles) == 1


def test_prompts_no_tile_holds_are_refused_and_change_nothing(big_session):
    from triton_sam.errors import InvalidInputError

    session = big_session
    session.add_point(300, 300)
    with pytest.raises(InvalidInputError, match="no 1024x1024 tile holds them all"):
        session.add_point(2900, 2500)
    with pytest.raises(InvalidInputError):
        session.set_box(100, 100, 1500, 400)
    assert session.prompts.points == [(300.0, 300.0)] and session.prompts.box is None
    committed = session.commit()
    assert committed is not None and committed.offset == (0, 0)


def test_prompts_off_a_large_plane_are_refused_as_the_predictor_refuses_them_and_its_edges_are_on_it(big_session):
    from triton_sam.errors import InvalidInputError

    session = big_session
    with pytest.raises(InvalidInputError, match=r"Point \(-30, 10\) lies outside the image \(x in 0..3000, y in 0..2600"):
        session.add_point(-30, 10)
    with pytest.raises(InvalidInputError, match=r"Box corner \(3100, 300\) lies outside the image"):
        session.set_box(2900, 100, 3100, 300)
    assert session.object.empty
    session.add_point(BIG_W - 0.25, 1400)  # in the last pixel column
    decoded = session.previews.wait_for(lambda p: p is not None and p.candidate is not None)
    assert decoded.tile.x1 == BIG_W and session.object.points == [(BIG_W - 0.25, 1400.0)]


@pytest.mark.parametrize("encode_or_prefetch", ["encode_tiles", "cache_plane"])
def test_the_next_tile_is_read_while_a_tile_is_encoded(session, monkeypatch, encode_or_prefetch):
    """From slow storage, a tile's read overlaps the encode of the tile before it (on a GPU server
    a read can take longer than an encode), on the plane shown and on one prefetched."""
    plane = SlowReads(BIG, 0.2)
    encoded = slow_encodes(session.engine, 0.2, monkeypatch)
    session.set_plane(("slow", 0), plane)
    tiles = session.tiles[:3]
    if encode_or_prefetch == "encode_tiles":
        assert session.encode_tiles(tiles) == 3
    else:
        cache_plane(plane, session.cache, tiles)
    read = [plane.read_at(tile.window) for tile in tiles]
    assert len(encoded) == 3 and all(read[k + 1] < encoded[k] for k in range(2))


def test_a_stack_is_prefetched_plane_by_plane_each_read_while_the_one_before_is_encoded(session, monkeypatch):
    """`cache_planes` (napari's "Encode all planes"): every plane into the cache, progress after
    each, each whole plane read while the one before it is encoded; stopped, it encodes no more."""
    planes = [SlowReads(disk_image(H, W, [(60 + 40 * i, 100, 30)]), 0.2) for i in range(3)]
    encoded = slow_encodes(session.engine, 0.2, monkeypatch)
    assert list(cache_planes([(plane, None) for plane in planes], session.cache)) == [1, 2, 3]
    read = [plane.read_at(...) for plane in planes]
    assert len(encoded) == 3 and all(read[k + 1] < encoded[k] for k in range(2))
    misses = session.cache.misses
    session.set_plane(("stack", 2), planes[2].array)
    assert session.cache.misses == misses  # found in the cache
    others = [(disk_image(H, W, [(200, 100 + 20 * i, 30)]), None) for i in range(3)]
    assert list(cache_planes(others, session.cache, stopped=lambda: len(encoded) >= 4)) == [1]


def test_a_stack_goes_to_an_engine_that_encodes_several_planes_at_once_that_many_at_a_time(session, monkeypatch):
    """Encoding all planes through a server that encodes images together: whole planes go
    `encode_batch` at a time, progress still plane by plane; each plane is then found in the cache."""
    engine = session.engine
    monkeypatch.setattr(engine, "encode_batch", 3, raising=False)
    batches, encode_many = [], engine.encode_many
    monkeypatch.setattr(engine, "encode_many", lambda images: batches.append(len(images)) or encode_many(images))
    planes = [disk_image(H, W, [(60 + 30 * i, 120, 25)]) for i in range(5)]
    assert list(cache_planes([(plane, None) for plane in planes], session.cache)) == [1, 2, 3, 4, 5]
    assert batches == [3, 2]
    misses = session.cache.misses
    for number, plane in enumerate(planes):
        session.set_plane(("stack", number), plane)
    assert session.cache.misses == misses and batches == [3, 2]  # all found in the cache


def test_encoding_tiles_stops_when_asked_when_the_plane_changes_or_when_the_session_closes(big_session):
    session = big_session
    asked = []
    done = session.encode_tiles(session.tiles, should_stop=lambda: len(asked) >= 2, on_progress=lambda d, t: asked.append(d))
    assert done == 2 and asked == [1, 2]
    session.set_plane(("img", 0), IMAGE)  # a small plane: one tile, encoded by set_plane, as before
    assert len(session.tiles) == 1 and session.tiles[0].shape == (H, W) and session.encoded(session.tiles[0])
    session.set_plane(("big", 0), BIG)
    session.hover(1400, 896)  # waits for its tile
    session.close()
    assert session.encode_tiles(session.tiles) == 0  # closed: nothing more is encoded, no hover asked


LARGE_DISK = (1100, 1300, 600)  # wider than a native tile: only a coarse tile holds it whole
ZOOMED_OUT = disk_image(BIG_H, BIG_W, [LARGE_DISK, (300, 300, 60)])


def test_zoomed_out_coarse_tiles_hold_large_objects_preview_reduced_and_commit_at_full_resolution(session, synthetic_repository):
    from triton_sam.tiled_predictor import TiledPredictor

    session.set_plane(("zoomed out", 0), ZOOMED_OUT)
    x, y, r = LARGE_DISK
    native = next(t for t in session.tiles if t.holds(np.array([[x, y]])))
    session.encode_tiles([native])
    session.hover(x, y)
    cut = session.previews.wait_for(lambda p: p is not None and p.point == (x, y))
    assert cut.step == 1 and _on_plane(cut.mask, cut.offset)[_disk(x, y, r)].mean() < 0.9  # a native tile cuts it

    session.set_tile_step(2)  # zoomed out: 2048-px tiles, encoded from the plane reduced twice
    assert session.tile_step == 2 and len(session.tiles) == 4 and all(t.step == 2 for t in session.tiles)
    session.encode_tiles(session.tiles)
    session.hover(x + 3, y)
    preview = session.previews.wait_for(lambda p: p is not None and p.point == (x + 3, y))
    assert preview.step == 2 and preview.mask.shape == preview.tile.reduced_shape == (1024, 1024)
    assert preview.offset[0] % 2 == 0 and preview.offset[1] % 2 == 0
    committed = session.commit()
    assert committed.provenance["tile_step"] == 2 and committed.provenance["tile"] == [
        preview.tile.y0,
        preview.tile.x0,
        preview.tile.y1,
        preview.tile.x1,
    ]
    placed, disk = _on_plane(committed.mask, committed.offset), _disk(x, y, r)
    assert placed[disk].mean() > 0.95 and placed[~disk].mean() < 0.001  # whole, at full resolution
    with TiledPredictor(model_repository=synthetic_repository) as tiled:  # the same tile through the Python API
        tiled.set_image(ZOOMED_OUT, step=2)
        masks, _, _, tile = tiled.predict_in_tile(np.array([[x + 3, y]]), np.array([1]), multimask_output=False)
    assert tile == preview.tile and np.count_nonzero(placed != tiles_place(masks[0], tile, (BIG_H, BIG_W))) <= 4  # float rounding
    reduced = placed[tile.y0 : tile.y1 : 2, tile.x0 : tile.x1 : 2]
    assert np.count_nonzero(reduced != preview.mask) < 0.01 * preview.mask.sum()  # the preview shows what is stored


def test_an_object_clicked_zoomed_out_is_decoded_again_with_native_tiles_after_zooming_in(session):
    session.set_plane(("zoomed out", 0), ZOOMED_OUT)
    session.set_tile_step(4)  # the whole plane in one tile
    assert session.tiles == [Tile(0, 0, BIG_H, BIG_W, 4)]
    session.add_point(300, 300)
    coarse = session.previews.wait_for(lambda p: p is not None and p.candidate is not None)
    assert coarse.step == 4 and coarse.offset == (0, 0)

    session.set_tile_step(1)
    session.encode_tiles([session.tiles[0]])
    session.hover(320, 300)  # the object is decoded again with the native tile; then the hint comes with it
    hinted = session.previews.wait_for(lambda p: p is not None and p.hint is not None and p.point == (320, 300))
    assert hinted.step == 1 and hinted.tile == session.tiles[0]
    committed = session.commit()
    assert committed.provenance["tile_step"] == 1 and committed.mask.shape == (1024, 1024)
    placed, disk = _on_plane(committed.mask, committed.offset), _disk(300, 300, 60)
    assert placed[disk].mean() > 0.95 and placed[~disk].mean() < 0.001


def test_coarse_tiles_are_read_from_the_pyramid_level_of_their_step(session):
    level = ReadLog(ZOOMED_OUT[::4, ::4])
    full = ReadLog(ZOOMED_OUT)
    session.set_plane(("pyramid", 0), full, levels={4: level})
    session.set_tile_step(4)
    assert session.encode_tiles(session.tiles) == 1
    assert level.reads == [(slice(0, 650), slice(0, 750))] and len(full.reads) <= 1  # level 0: the contrast sample at most
    session.set_tile_step(8)  # coarser than the pyramid: its coarsest level that divides 8, reduced by the encoder
    assert session.tiles == [Tile(0, 0, BIG_H, BIG_W, 8)] and session.encode_tiles(session.tiles) == 1
    assert level.reads[-1] == (slice(0, 650), slice(0, 750)) and len(full.reads) <= 1
    session.set_tile_step(4)
    x, y, r = LARGE_DISK
    session.hover(x, y)
    session.previews.wait_for(lambda p: p is not None and p.point == (x, y))
    committed = session.commit()
    placed, disk = _on_plane(committed.mask, committed.offset), _disk(x, y, r)
    assert placed[disk].mean() > 0.95 and placed[~disk].mean() < 0.01


def test_coarse_tiles_beyond_the_pyramid_are_reduced_while_read_a_band_at_a_time(session):
    """A 4600-px plane with no pyramid, zoomed out to one tile: its 4600-px window (over the 4096 px
    read whole) is read in bands, not at once, and the object still comes whole at full resolution."""
    side, (x, y, r) = 4600, (2300, 2200, 1200)
    plane = ReadLog(disk_image(side, side, [(x, y, r)]))
    session.set_plane(("no pyramid", 0), plane)
    session.set_tile_step(8)
    assert session.tiles == [Tile(0, 0, side, side, 8)] and session.encode_tiles(session.tiles) == 1
    bands = [key for key in plane.reads if key[1] == slice(0, side)]
    assert len(bands) > 1 and bands[0][0].start == 0 and bands[-1][0].stop == side
    assert all(band[0].stop - band[0].start < side // 2 for band in bands)
    session.hover(x, y)
    session.previews.wait_for(lambda p: p is not None and p.point == (x, y))
    committed = session.commit()
    placed = np.zeros((side, side), bool)
    (top, left), (height, width) = committed.offset, committed.mask.shape
    placed[top : top + height, left : left + width] = committed.mask
    yy, xx = np.mgrid[:side, :side]
    disk = (xx - x) ** 2 + (yy - y) ** 2 <= r**2
    assert placed[disk].mean() > 0.95 and placed[~disk].mean() < 0.01


def test_tiles_of_a_plane_not_shown_are_prefetched_into_the_cache_until_asked_to_stop(big_session):
    session = big_session
    other = disk_image(BIG_H, BIG_W, [(1450, 896, 70)])
    wanted = [t for t in session.tiles if t.holds(np.array([[1450, 896]]))] + [session.tiles[0]]  # 3 contents
    misses, hits = session.cache.misses, session.cache.hits
    cache_plane(other, session.cache, wanted, ready=lambda: session.cache.misses - misses < 2)
    assert session.cache.misses - misses == 2  # stopped before the third
    cache_plane(other, session.cache, wanted)
    assert session.cache.misses - misses == 3 and session.cache.hits - hits == 2
    session.set_plane(("other", 0), other)
    assert session.encode_tiles(wanted) == 3 and session.cache.misses - misses == 3  # shown: found in the cache
    session.hover(1450, 896)
    preview = session.previews.wait_for(lambda p: p is not None and p.point == (1450, 896))
    assert _on_plane(preview.mask, preview.offset)[_disk(1450, 896, 70)].mean() > 0.95


def test_a_cache_given_empty_is_the_one_used(synthetic_repository, tmp_path):
    """The panel makes its cache (with the disk folder the user chose) before anything is encoded:
    an empty cache is still the session's and the tiled predictor's, not swapped for a memory-only one."""
    from triton_sam.features import FeatureCache
    from triton_sam.tiled_predictor import TiledPredictor

    engine = create_engine(TINY, "local", synthetic_repository)
    cache = FeatureCache(engine, disk_dir=tmp_path)
    assert len(cache) == 0
    session = InteractiveSession(engine, Previews(), cache=cache)
    with TiledPredictor(TINY.model_id, engine=engine, cache=cache) as predictor:
        assert session.cache is cache and predictor.cache is cache
    session.set_plane(("img", 0), IMAGE)
    assert len(cache) == 1 and session.cache.disk_wanted  # encoded into the cache given, the user's disk choice kept
    session.close()
