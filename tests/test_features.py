"""The embedding cache: keyed by content, bounded in megabytes, one encode per image."""

import io
import json
import logging
import threading
import time

import numpy as np
import pytest

from synthetic import write_repository
from triton_sam import contract
from triton_sam.cli import main
from triton_sam.engines import create_engine
from triton_sam.features import ENV_DISK_GB, FeatureCache, content_signature, disk_files
from triton_sam.registry import get_model
from triton_sam.repository import locate
from triton_sam.server.local import free_ports

TINY = get_model("sam2.1_hiera_tiny")


class CountingEngine:
    """The real local engine, counting encodes and the images handed over at once."""

    def __init__(self, engine) -> None:
        self.engine, self.spec, self.encodes, self.batches = engine, engine.spec, 0, []
        self.weights_id, self.detector_maps = engine.weights_id, engine.detector_maps

    def encode_many(self, images):
        self.encodes += len(images)
        self.batches.append(len(images))
        return self.engine.encode_many(images)


def _image(value: int) -> np.ndarray:
    return np.full((1024, 1024, 3), value, np.uint8)


def test_same_content_is_encoded_once_and_lru_bounded_in_megabytes(synthetic_repository):
    engine = CountingEngine(create_engine(TINY, "local", synthetic_repository))
    per_image_mb = sum(4 * np.prod(s) for s in TINY.feature_shapes.values()) / 2**20
    cache = FeatureCache(engine, max_mb=2.5 * per_image_mb)
    first = cache.features(_image(10))
    assert cache.features(_image(10).copy()) is first and engine.encodes == 1  # content, not identity
    cache.features(_image(20))
    cache.features(_image(10))  # touch: 20 is now the oldest
    cache.features(_image(30))
    assert len(cache) == 2 and cache.nbytes <= 2.5 * per_image_mb * 2**20
    keys = {content_signature(_image(v), TINY.model_id) for v in (10, 20, 30)}
    assert {k for k in keys if k in cache} == {content_signature(_image(v), TINY.model_id) for v in (10, 30)}
    assert engine.encodes == 3


def test_concurrent_requests_for_one_image_encode_it_once(synthetic_repository):
    engine = CountingEngine(create_engine(TINY, "local", synthetic_repository))
    cache = FeatureCache(engine)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.features(_image(5)))) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert engine.encodes == 1 and all(r is results[0] for r in results)


def test_images_asked_for_together_go_to_the_engine_together_unless_cached_or_being_encoded(synthetic_repository):
    """`features_many`: one `encode_many` for the new images (each once), the cached ones from the
    cache, one another caller is encoding from that caller; each as `features` gives it."""
    engine = CountingEngine(create_engine(TINY, "local", synthetic_repository))
    cache = FeatureCache(engine)
    cached = cache.features(_image(1))
    started, release = threading.Event(), threading.Event()
    encode_many = engine.engine.encode_many

    def held_encode_many(images):  # another caller's encode of image 2, held until released
        if np.array_equal(images[0], _image(2)):
            started.set()
            release.wait(10)
        return encode_many(images)

    engine.engine.encode_many = held_encode_many
    other = threading.Thread(target=lambda: cache.features(_image(2)))
    other.start()
    assert started.wait(10)
    threading.Timer(0.3, release.set).start()
    images = [_image(v) for v in (3, 1, 2, 4, 3)]
    got = cache.features_many(images)
    other.join()
    assert engine.batches == [1, 1, 2]  # 1 and 2 alone; 3 and 4 together, 3 once
    assert got[1] is cached and got[0] is got[4]
    assert all(g is cache.features(image) for g, image in zip(got, images))
    fresh = FeatureCache(create_engine(TINY, "local", synthetic_repository))
    for g, image in zip(got, images):
        for name, array in fresh.features(image).arrays.items():
            np.testing.assert_array_equal(g.arrays[name], array)


def test_the_signature_depends_on_content_shape_and_model():
    a = content_signature(_image(1), TINY.model_id)
    assert a == content_signature(_image(1), TINY.model_id)
    assert a != content_signature(_image(2), TINY.model_id)
    assert a != content_signature(_image(1), "sam2.1_hiera_small")
    black = np.zeros((768, 1024, 3), np.uint8)  # SAM1 inputs: same bytes, other shape
    assert content_signature(black, "sam_vit_b") != content_signature(black.reshape(1024, 768, 3), "sam_vit_b")


def test_the_disk_cache_makes_a_new_session_instant_and_is_keyed_by_weights(synthetic_repository, tmp_path):
    engine = CountingEngine(create_engine(TINY, "local", synthetic_repository))
    engine.weights_id = "synthetic-a"
    first = FeatureCache(engine, disk_dir=tmp_path).features(_image(7))
    again = FeatureCache(engine, disk_dir=tmp_path)  # a new session, same weights
    features = again.features(_image(7))
    assert engine.encodes == 1 and again.disk_hits == 1
    for name, array in first.arrays.items():
        np.testing.assert_array_equal(features.arrays[name], array)
    engine.weights_id = "synthetic-b"  # other weights: never reuse their features
    FeatureCache(engine, disk_dir=tmp_path).features(_image(7))
    assert engine.encodes == 2


def test_auto_without_a_server_keeps_features_on_disk_as_the_local_engine_does(tmp_path):
    """Backend Auto (the panel's default) on a laptop without a server runs the local engine: its
    exported files name their weights, so the disk cache keeps and reuses its features (it kept
    none: Auto named no weights)."""
    repository = write_repository(TINY, tmp_path / "repository")
    for component in (TINY.encoder_name, TINY.decoder_name):  # as `export --random-init --seed 3` writes it
        meta = repository / component / contract.METADATA_FILE
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "checkpoint": "random-init", "seed": 3}))
    auto = create_engine(TINY, "auto", repository, url=f"127.0.0.1:{free_ports(1)[0]}", timeout_s=1.0)
    assert auto.weights_id == f"{TINY.model_id}-seed-3" == locate(TINY, repository).weights_id
    engine = CountingEngine(auto)
    first = FeatureCache(engine, disk_dir=tmp_path / "disk").features(_image(5))
    again = FeatureCache(engine, disk_dir=tmp_path / "disk")  # tomorrow's session
    np.testing.assert_array_equal(again.features(_image(5)).arrays["image_embed"], first.arrays["image_embed"])
    assert engine.encodes == 1 and again.disk_hits == 1 and len(disk_files(tmp_path / "disk")) == 1
    auto.close()


def test_an_engine_that_names_no_weights_keeps_nothing_on_disk_and_the_log_says_so_once(
    synthetic_repository, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr("triton_sam.features._UNNAMED_WEIGHTS_SAID", set())
    engine = create_engine(TINY, "local", synthetic_repository)
    assert engine.weights_id is None  # the synthetic export's metadata names no checkpoint or seed
    with caplog.at_level(logging.WARNING, logger="triton_sam.features"):
        for value in (1, 2):
            FeatureCache(engine, disk_dir=tmp_path).features(_image(value))
        FeatureCache(engine).features(_image(3))  # no disk cache asked for: nothing to say
    assert disk_files(tmp_path) == []
    assert [record.getMessage() for record in caplog.records] == [
        f"Image features are not kept on disk: {engine.describe()} does not say which weights made them, "
        "and features of unknown weights are never reused."
    ]


def _damaged(kind: str, good: bytes, arrays: dict[str, np.ndarray]) -> bytes:
    """A cache file's bytes: unreadable, truncated, or a readable npz this model did not write."""
    if kind == "garbage":
        return b"garbage"
    if kind == "truncated":
        return good[: len(good) // 2]
    foreign = {
        "other names": {f"x{i}": a for i, a in enumerate(arrays.values())},
        "wrong shape": {name: a[..., :-1] for name, a in arrays.items()},
        "float64": {name: a.astype(np.float64) for name, a in arrays.items()},
        "nan": {name: np.full_like(a, np.nan) for name, a in arrays.items()},
        "pickled objects": {name: np.array([object()] * 2) for name in arrays},
    }[kind]
    buffer = io.BytesIO()
    np.savez(buffer, **foreign)
    return buffer.getvalue()


@pytest.mark.parametrize("kind", ["garbage", "truncated", "other names", "wrong shape", "float64", "nan", "pickled objects"])
def test_a_corrupt_or_foreign_cache_file_is_never_used_and_is_replaced(kind, synthetic_repository, tmp_path):
    engine = CountingEngine(create_engine(TINY, "local", synthetic_repository))
    engine.weights_id = "synthetic"
    features = FeatureCache(engine, disk_dir=tmp_path).features(_image(9))
    (cached,) = (tmp_path / "synthetic").glob("*.npz")
    cached.write_bytes(_damaged(kind, cached.read_bytes(), features.arrays))
    cache = FeatureCache(engine, disk_dir=tmp_path)
    again = cache.features(_image(9))
    assert engine.encodes == 2 and cache.disk_hits == 0
    for name, array in features.arrays.items():
        np.testing.assert_array_equal(again.arrays[name], array)
    assert FeatureCache(engine, disk_dir=tmp_path).features(_image(9)) and engine.encodes == 2  # rewritten


def test_the_disk_cache_is_private_to_the_user(synthetic_repository, tmp_path):
    engine = CountingEngine(create_engine(TINY, "local", synthetic_repository))
    engine.weights_id = "synthetic"
    features = FeatureCache(engine, disk_dir=tmp_path).features(_image(3))
    (cached,) = (tmp_path / "synthetic").glob("*.npz")
    assert (tmp_path / "synthetic").stat().st_mode & 0o777 == 0o700
    assert cached.stat().st_mode & 0o077 == 0
    with np.load(cached) as stored:  # features only: no image pixels on disk
        assert sorted(stored.files) == sorted(features.arrays)


def test_the_disk_cache_is_bounded_and_lets_go_of_the_files_used_least_recently(synthetic_repository, tmp_path):
    """Every model's files count; a file read from disk counts as used then."""
    engine = CountingEngine(create_engine(TINY, "local", synthetic_repository))
    engine.weights_id = "synthetic-a"
    file_mb = FeatureCache(engine, disk_dir=tmp_path, disk_max_mb=1e6).features(_image(1)).nbytes / 2**20
    room = 2.5 * file_mb  # two files
    FeatureCache(engine, disk_dir=tmp_path, disk_max_mb=room).features(_image(2))
    time.sleep(0.05)  # file times apart
    again = FeatureCache(engine, disk_dir=tmp_path, disk_max_mb=room)
    again.features(_image(1))  # read from disk: now the most recent
    assert again.disk_hits == 1
    time.sleep(0.05)
    engine.weights_id = "synthetic-b"  # another model's files share the bound
    FeatureCache(engine, disk_dir=tmp_path, disk_max_mb=room).features(_image(3))
    kept = {path.parent.name: path.stem for path in disk_files(tmp_path)}
    assert len(disk_files(tmp_path)) == 2 and set(kept) == {"synthetic-a", "synthetic-b"}
    assert kept["synthetic-a"] == content_signature(_image(1), TINY.model_id)  # image 2 went: used least recently
    assert engine.encodes == 3


def test_the_cache_command_says_what_the_disk_cache_holds_and_clears_it(synthetic_repository, tmp_path, monkeypatch, capsys):
    engine = CountingEngine(create_engine(TINY, "local", synthetic_repository))
    engine.weights_id = "synthetic"
    for value in (1, 2):
        FeatureCache(engine, disk_dir=tmp_path).features(_image(value))
    monkeypatch.setenv(ENV_DISK_GB, "3.5")
    assert main(["cache", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("2 files of image features, 0.03 GB of at most 3.5 GB")
    assert main(["cache", "--dir", str(tmp_path), "--clear"]) == 0 and disk_files(tmp_path) == []
    monkeypatch.setenv(ENV_DISK_GB, "lots")
    assert main(["cache", "--dir", str(tmp_path)]) == 2
    assert f"${ENV_DISK_GB} must be a number of gigabytes" in capsys.readouterr().err


def test_a_disk_folder_that_cannot_be_written_leaves_the_features_in_memory(synthetic_repository, tmp_path, caplog):
    """A write that fails (a file where the folder should be: unwritable even for root) is said once
    and turns the disk off; the encode it followed is not lost and nothing else fails."""
    engine = CountingEngine(create_engine(TINY, "local", synthetic_repository))
    engine.weights_id = "synthetic"
    (tmp_path / "taken").write_text("a file, not a folder")
    cache = FeatureCache(engine, disk_dir=tmp_path / "taken")
    with caplog.at_level(logging.WARNING, logger="triton_sam.features"):
        first = cache.features(_image(4))
        cache.features(_image(5))
    assert cache.features(_image(4)) is first and engine.encodes == 2
    assert f"memory only: {tmp_path / 'taken'} cannot be written (Not a directory)" in cache.disk_error
    assert caplog.text.count("cannot be written") == 1 and "does not say which weights" not in caplog.text
