"""The panel's "Triton URL" takes several servers, comma-separated: one that does not answer is
skipped, and the plugin segments on the others."""

from __future__ import annotations

import pytest

from benchmarks.wire import free_port
from synthetic import disk_image

napari = pytest.importorskip("napari")
from qtpy.QtCore import Qt  # noqa: E402
from qtpy.QtTest import QTest  # noqa: E402
from test_widget import move, world  # noqa: E402


def test_a_server_list_with_one_server_down_still_previews(qtbot, viewer, synthetic_server):
    image = viewer.add_image(disk_image(300, 400, [(100, 100, 50), (300, 200, 40)]))
    viewer.reset_view()
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.backend_box.setCurrentText("Triton")
    widget.form.url_field.setText(f"127.0.0.1:{free_port()}, {synthetic_server.grpc_url}")
    QTest.keyClick(widget.form.url_field, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: widget.form.status.label.text().startswith(f"Triton at {synthetic_server.grpc_url}"), timeout=10000)
    widget.connect_engine()
    qtbot.waitUntil(lambda: widget.ready, timeout=30000)
    with qtbot.waitSignal(widget.preview_shown, timeout=30000):
        move(viewer, world(image, 100, 100))
    assert widget.session.engine.servers.encodes == {synthetic_server.grpc_url: 1}
    widget.close_session()
