"""The shipped HAProxy configuration run locally in front of local Triton servers, for the `servers`
benchmark and the routing tests: its server lines and ports replaced by ours, its state read back."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from triton_sam.server.local import LocalTritonServer, free_ports

CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "haproxy" / "haproxy.cfg"
AFFINITY = "balance hdr(triton-sam-image)"  # the shipped file's balancing: each image on one server
ROUND_ROBIN = "balance roundrobin"  # a stateless balancer's, as Triton's Helm chart has


def haproxy_binary() -> str | None:
    """HAProxy's executable, or None where it is not installed (scripts/install-system-packages.sh installs it)."""
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")


def balancer_config(grpc_port: int, stats_port: int, servers: dict[str, LocalTritonServer], balance: str = AFFINITY) -> str:
    """The shipped configuration with its server lines replaced by `servers`, its ports by ours and
    its balancing by `balance`."""
    lines = [line for line in CONFIG.read_text().splitlines() if not line.lstrip().startswith("server ")]
    assert lines[-1].lstrip().startswith("default-server "), "the server lines end the shipped file"
    lines += [f"    server {name} {server.grpc_url} port {server.ports['http']}" for name, server in servers.items()]
    text = "\n".join(lines) + "\n"
    replacements = (
        ("bind :8001 ", f"bind 127.0.0.1:{grpc_port} "),
        ("bind :8404\n", f"bind 127.0.0.1:{stats_port}\n"),
        (f"    {AFFINITY}\n", f"    {balance}\n"),
    )
    for shipped, ours in replacements:
        assert text.count(shipped) == 1, shipped
        text = text.replace(shipped, ours)
    return text


class Balancer:
    """A running HAProxy process in front of `servers` (its configuration and log in `directory`)."""

    def __init__(self, directory: Path, servers: dict[str, LocalTritonServer], balance: str = AFFINITY) -> None:
        binary = haproxy_binary()
        if binary is None:
            raise FileNotFoundError("haproxy is not installed: scripts/install-system-packages.sh installs it")
        grpc_port, stats_port = free_ports(2)
        config = Path(directory) / "haproxy.cfg"
        config.write_text(balancer_config(grpc_port, stats_port, servers, balance))
        self.url = f"127.0.0.1:{grpc_port}"
        self.stats_url = f"http://127.0.0.1:{stats_port}/stats;csv"
        self.log = config.with_suffix(".log")
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)

    def server_states(self) -> dict[str, str]:
        """Each backend server's state and last health check, e.g. "UP L7OK" or "DOWN L4CON"
        (a server is UP before its first check, with no check status yet)."""
        with urllib.request.urlopen(self.stats_url, timeout=5) as response:
            rows = csv.DictReader(io.StringIO(response.read().decode().lstrip("# ")))
            servers = (row for row in rows if row["pxname"] == "triton" and row["svname"] != "BACKEND")
            return {row["svname"]: f"{row['status'].split()[0]} {row['check_status'].lstrip('* ')}" for row in servers}

    def wait_for(self, expected: dict[str, str], timeout_s: float = 30.0) -> None:
        """Return once the servers' states are `expected`; TimeoutError (with HAProxy's log) if not in time."""
        deadline, states = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"HAProxy exited:\n{self.log.read_text()[-4000:]}")
            try:
                states = self.server_states()
            except OSError:  # not listening yet
                pass
            if states == expected:
                return
            time.sleep(0.2)
        log = "\n".join(line for line in self.log.read_text().splitlines() if "/stats" not in line)
        raise TimeoutError(f"HAProxy's servers are {states}, not {expected}:\n{log[-4000:]}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)

    def __enter__(self) -> Balancer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
