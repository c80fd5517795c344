"""The SGLang launcher's failure paths, with stand-in interpreters (no SGLang needed).

The launcher against the real server is exercised by tests/conformance (its fixture)."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from miles_lite.testing import SGLangServer, SGLangServerConfig, StandInError
from miles_lite.testing.launcher import free_port
from miles_lite.testing.sglang_server import shm_leftovers, shm_names


def fake_venv(tmp_path: Path, script: str) -> Path:
    """A venv whose python is ``script`` (bash), with a model folder beside it."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/usr/bin/env bash\n" + script)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    (venv / "tiny-qwen2").mkdir()
    (venv / "tiny-qwen2" / "config.json").write_text("{}")
    return venv


def test_missing_venv_names_the_setup_script(tmp_path: Path) -> None:
    server = SGLangServer(SGLangServerConfig(venv=tmp_path / "nowhere"))
    with pytest.raises(StandInError, match=r"scripts/sglang-cpu/setup\.sh"):
        server.start()


def test_missing_model_names_the_setup_script(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path, "exit 0\n")
    with pytest.raises(StandInError, match="no model at"):
        SGLangServer(SGLangServerConfig(venv=venv, model_path=tmp_path / "none")).start()


def test_server_that_exits_while_starting_shows_its_log(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path, 'echo "boom: args were $*"\nexit 3\n')
    with (
        pytest.raises(StandInError, match="exited with code 3") as info,
        SGLangServer(SGLangServerConfig(venv=venv)),
    ):
        pass
    assert "boom: args were -m sglang.launch_server" in str(info.value)
    assert "--attention-backend torch_native" in str(info.value)


def test_start_timeout_stops_the_whole_tree(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # A "server" that never answers /health and spawns a child in another process group,
    # as SGLang's scheduler does not: the tree walk must still find it.
    venv = fake_venv(
        tmp_path,
        f"setsid sleep 300 &\necho $! > {pids}\necho starting\nexec sleep 300\n",
    )
    server = SGLangServer(SGLangServerConfig(venv=venv, start_timeout_s=1.5, stop_timeout_s=1))
    t0 = time.monotonic()
    with pytest.raises(StandInError, match="did not answer /health") as info:
        server.start()
    assert time.monotonic() - t0 < 10
    assert "starting" in str(info.value)
    root = server.pid
    child = int(pids.read_text())
    for pid in (root, child):
        assert pid is not None
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(StandInError):
        server.start()
    with pytest.raises(StandInError):
        _ = server.url


def test_a_server_whose_port_was_taken_fails_at_once_naming_it(tmp_path: Path) -> None:
    # uvicorn's words when the port went to someone else while SGLang started; the server
    # then neither serves nor exits.
    venv = fake_venv(
        tmp_path,
        'echo "ERROR:    [Errno 98] error while attempting to bind on address'
        " ('127.0.0.1', 45599): address already in use\"\nexec sleep 300\n",
    )
    server = SGLangServer(SGLangServerConfig(venv=venv, start_timeout_s=120, stop_timeout_s=1))
    t0 = time.monotonic()
    with pytest.raises(StandInError, match="the port was taken") as info:
        server.start()
    assert time.monotonic() - t0 < 30  # not the 120 s start timeout
    assert "Errno 98" in str(info.value)
    root = server.pid
    assert root is not None
    assert not psutil.pid_exists(root) or psutil.Process(root).status() == psutil.STATUS_ZOMBIE


@pytest.mark.skipif(not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="Linux")
def test_free_ports_lie_below_the_ephemeral_range_and_avoid_what_they_are_told() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port("127.0.0.1") for _ in range(20)}
    assert all(10000 <= p < low for p in ports), sorted(ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free when picked, and still
    random.seed(7)
    first = free_port("127.0.0.1")
    random.seed(7)
    assert free_port("127.0.0.1", avoid={first}) != first


def test_stop_is_idempotent_and_url_needs_a_running_server(tmp_path: Path) -> None:
    server = SGLangServer(SGLangServerConfig(venv=tmp_path))
    with pytest.raises(StandInError):
        _ = server.url
    server.stop()
    server.stop()


def test_command_carries_the_cpu_flags(tmp_path: Path) -> None:
    config = SGLangServerConfig(venv=tmp_path, extra_args=("--log-level", "warning"))
    cmd = SGLangServer(config).command(31234)
    assert cmd[:3] == [str(tmp_path / "bin" / "python"), "-m", "sglang.launch_server"]
    joined = " ".join(cmd)
    for flag in (
        "--device cpu",
        "--port 31234",
        "--host 127.0.0.1",
        "--grammar-backend none",
        f"--model-path {tmp_path / 'tiny-qwen2'}",
        "--dtype float32",
    ):
        assert flag in joined
    assert cmd[-2:] == ["--log-level", "warning"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("venv", "not-a-path"),
        ("model_path", "x"),
        ("port", -1),
        ("port", True),
        ("start_timeout_s", 0),
        ("stop_timeout_s", -1.0),
        ("max_running_requests", 0),
        ("max_total_tokens", 1.5),
        ("extra_args", ["--x"]),
    ],
)
def test_config_errors_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"SGLangServerConfig.{field}"):
        SGLangServerConfig(**{field: value})  # type: ignore[arg-type]


def test_default_model_is_inside_the_venv(tmp_path: Path) -> None:
    config = SGLangServerConfig(venv=tmp_path)
    assert config.model == tmp_path / "tiny-qwen2"
    assert SGLangServerConfig(venv=tmp_path, model_path=tmp_path / "m").model == tmp_path / "m"


HEALTH_SERVER = """
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_sigterm_to_the_command_line_stops_its_server(tmp_path: Path) -> None:
    # A "server" that answers /health on the port it is given, as SGLang does.
    venv = fake_venv(tmp_path, f'exec {sys.executable} -c "$HEALTH" "$@"\n')
    env = {**os.environ, "HEALTH": HEALTH_SERVER}
    cli = subprocess.Popen(
        [sys.executable, "-m", "miles_lite.testing.sglang_server", "--venv", str(venv)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert cli.stdout is not None
    try:
        line = cli.stdout.readline()
        assert line.startswith("SGLang ready at http://127.0.0.1:"), line
        servers = psutil.Process(cli.pid).children()
        assert len(servers) == 1
        server = servers[0]
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=30) == 0
        # The server went with it (it was left running, re-parented, before).
        gone, alive = psutil.wait_procs([server], timeout=10)
        assert [p.pid for p in gone] == [server.pid] and not alive
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        cli.stdout.close()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="Linux: /dev/shm and /proc")
def test_a_killed_servers_semaphores_are_removed_and_nothing_in_use_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A "server" that makes a multiprocessing semaphore (its resource tracker, a child of
    # its own, would unlink it at exit), as SGLang's processes do, then answers /health.
    script = "import multiprocessing\nlock = multiprocessing.get_context('spawn').Lock()\n"
    venv = fake_venv(tmp_path, f'exec {sys.executable} -c "$HEALTH" "$@"\n')
    monkeypatch.setenv("HEALTH", script + HEALTH_SERVER)
    before = shm_names()
    server = SGLangServer(SGLangServerConfig(venv=venv, stop_timeout_s=1))
    with server:
        made = {n for n in shm_names() - before if n.startswith("sem.mp-")}
        assert made, "the fake server made no semaphore"
        # Ours, made while the server runs, and in use: never taken for the server's.
        ours = multiprocessing.get_context("spawn").Lock()
        assert shm_leftovers(before) == []  # all mapped by a live process
        assert server.pid is not None
        os.killpg(server.pid, signal.SIGKILL)  # as the chaos tier kills an engine
        psutil.wait_procs([psutil.Process(server.pid)], timeout=10)
        # The tracker died with the group: the semaphore is left, and mapped by nobody.
        assert made <= set(shm_leftovers(before)), shm_leftovers(before)
    assert not made & shm_names()  # stop() removed them
    assert shm_leftovers(before) == []
    assert any(n.startswith("sem.mp-") for n in shm_names() - before)  # ours stays
    del ours
