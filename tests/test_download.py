"""Downloads against a real HTTP server on 127.0.0.1."""

import hashlib
import http.server
import socket
import subprocess
import sys
import threading
from functools import partial

import pytest

from triton_sam.download import download
from triton_sam.errors import DownloadError

PAYLOAD = bytes(range(256)) * 5000  # 1.28 MB, several chunks
SHA256 = f"sha256:{hashlib.sha256(PAYLOAD).hexdigest()}"


@pytest.fixture
def server(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "weights.pt").write_bytes(PAYLOAD)
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_download_verifies_and_reports_progress(server, tmp_path):
    seen = []
    target = tmp_path / "out" / "weights.pt"
    path = download(f"{server}/weights.pt", SHA256, target, lambda d, t: seen.append((d, t)))
    assert path.read_bytes() == PAYLOAD
    assert seen[-1] == (len(PAYLOAD), len(PAYLOAD)) and len(seen) > 1
    assert [p.name for p in target.parent.iterdir()] == ["weights.pt"]


def test_wrong_hash_leaves_nothing_behind(server, tmp_path):
    target = tmp_path / "dl" / "weights.pt"
    with pytest.raises(DownloadError, match=f"checksum is {SHA256}, not the expected sha256:0000"):
        download(f"{server}/weights.pt", "sha256:" + "0" * 64, target)
    assert list(target.parent.iterdir()) == []


def test_missing_file_and_offline_give_clear_errors(server, tmp_path):
    target = tmp_path / "dl" / "x.pt"
    with pytest.raises(DownloadError, match="HTTP 404"):
        download(f"{server}/nope.pt", "sha256:" + "0" * 64, target)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free_port = sock.getsockname()[1]
    with pytest.raises(DownloadError, match=f"Could not download http://127.0.0.1:{free_port}/w.pt"):
        download(f"http://127.0.0.1:{free_port}/w.pt", "sha256:" + "0" * 64, target, timeout=5)
    assert list(target.parent.iterdir()) == []


def _unreachable_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/x.pt"


@pytest.mark.parametrize("model_id", ["sam2.1_hiera_tiny", "vit_b_lm"])
def test_setup_offline_names_the_file_to_fetch_and_where_setup_finds_it(model_id, tmp_path):
    """The hint gives the official URL, the path setup looks at, and the export alternative; a
    verified file put at that path is then used without a download."""
    import dataclasses

    from triton_sam.download import download_checkpoint
    from triton_sam.registry import get_model

    spec = get_model(model_id)
    command = [
        sys.executable,
        "-m",
        "triton_sam.cli",
        "setup",
        spec.model_id,
        "--url",
        _unreachable_url(),
        "--dir",
        str(tmp_path),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    destination = tmp_path / spec.checkpoint_filename
    assert result.returncode == 2 and "Traceback" not in result.stderr
    for hint in (spec.url, str(destination), f"triton-sam export {spec.model_id} --checkpoint PATH"):
        assert hint in result.stderr
    assert "B/s" not in result.stderr + result.stdout  # no empty progress bar
    assert list(tmp_path.iterdir()) == []
    destination.write_bytes(PAYLOAD)
    offline_spec = dataclasses.replace(spec, checksum=SHA256)
    assert download_checkpoint(offline_spec, tmp_path, url=_unreachable_url()) == destination


def test_corrupt_existing_file_is_replaced(server, tmp_path):
    target = tmp_path / "weights.pt"
    target.write_bytes(b"truncated")
    download(f"{server}/weights.pt", SHA256, target)
    assert target.read_bytes() == PAYLOAD


def test_a_gated_checkpoint_says_how_to_get_it_and_downloads_nothing(tmp_path):
    from triton_sam.download import download_checkpoint
    from triton_sam.registry import get_model

    spec = get_model("sam3_tracker")
    with pytest.raises(DownloadError, match=r"gated.*licence.*triton-sam export sam3_tracker --checkpoint sam3.pt"):
        download_checkpoint(spec, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def micro_sam_file(server, tmp_path):
    """(vit_b_lm's spec with the checksum micro-sam computes for the served file, its URL): micro-sam's
    own `_compute_hash` (xxh128, written as its registry writes it) gives the expected checksum."""
    import dataclasses

    from triton_sam.registry import get_model

    micro_sam_util = pytest.importorskip("micro_sam.util")
    checksum = micro_sam_util._compute_hash(tmp_path / "served" / "weights.pt")
    assert checksum.startswith("xxh128:")
    return dataclasses.replace(get_model("vit_b_lm"), checksum=checksum), f"{server}/weights.pt"


def test_a_micro_sam_model_is_verified_by_its_xxh128_checksum(micro_sam_file, tmp_path):
    from triton_sam.download import download_checkpoint

    spec, url = micro_sam_file
    path = download_checkpoint(spec, tmp_path / "checkpoints", url=url)
    assert path == tmp_path / "checkpoints" / "vit_b_lm.pt"  # not "vit_b.pt": several micro-sam models are
    assert path.read_bytes() == PAYLOAD
    assert download_checkpoint(spec, tmp_path / "checkpoints", url=_unreachable_url()) == path  # kept: verified


def test_a_corrupted_micro_sam_model_is_refused_and_nothing_is_kept(micro_sam_file, tmp_path):
    from triton_sam.download import download_checkpoint

    spec, url = micro_sam_file
    served = tmp_path / "served" / "weights.pt"
    served.write_bytes(PAYLOAD[:1000] + b"x" + PAYLOAD[1001:])  # one byte changed on the server
    with pytest.raises(
        DownloadError, match=rf"checksum is xxh128:[0-9a-f]{{32}}, not the expected {spec.checksum}.*nothing was kept"
    ):
        download_checkpoint(spec, tmp_path / "checkpoints", url=url)
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_an_unknown_checksum_algorithm_is_refused_before_downloading(server, tmp_path):
    with pytest.raises(DownloadError, match="Unknown checksum algorithm in 'md5:00'; known: sha256, xxh128"):
        download(f"{server}/weights.pt", "md5:00", tmp_path / "dl" / "weights.pt")
    assert not (tmp_path / "dl").exists()


def test_a_micro_sam_decoder_is_verified_beside_its_checkpoint_and_offline_names_url_and_path(server, tmp_path):
    """`setup` fetches the decoder as it fetches the checkpoint: verified, into the same folder, and
    offline the error names the decoder's URL, where setup finds it, and the export that takes it."""
    import dataclasses

    from triton_sam.download import download_decoder
    from triton_sam.registry import get_model

    folder = tmp_path / "checkpoints"
    spec = dataclasses.replace(get_model("vit_b_lm"), decoder_url=f"{server}/weights.pt", decoder_checksum=SHA256)
    path = download_decoder(spec, folder)
    assert path == folder / "vit_b_lm_decoder.pt" and path.read_bytes() == PAYLOAD
    offline = dataclasses.replace(spec, decoder_url=_unreachable_url())
    assert download_decoder(offline, folder) == path  # kept: verified
    path.unlink()
    with pytest.raises(DownloadError) as error:
        download_decoder(offline, folder)
    for hint in (offline.decoder_url, str(path), "triton-sam export vit_b_lm --checkpoint PATH --decoder PATH"):
        assert hint in str(error.value)
    assert list(folder.iterdir()) == []
    assert download_decoder(get_model("sam_vit_b"), tmp_path) is None
