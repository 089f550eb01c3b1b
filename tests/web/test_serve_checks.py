"""``cabe serve`` checks its host and port before anything starts: one sentence, exit 2 (issue 12)."""

from __future__ import annotations

import socket

import pytest

from cabe.cli import main


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--port", "70000"], "port must be between 1 and 65535, got 70000"),
        (["--port", "0"], "port must be between 1 and 65535"),
        (["--port", "eighty"], "port must be a whole number"),
        (["--host", "999.1.1.1"], "host: '999.1.1.1' is not an address of this machine"),
        (["--host", "no-such-host.invalid"], "is not an address of this machine"),
    ],
)
def test_bad_host_or_port(capsys, argv, needle):
    assert main(["serve", *argv, "--lang", "en"]) == 2
    out, err = capsys.readouterr()
    assert needle in err and "Traceback" not in err
    assert "http://" not in out  # the URL is printed only once the socket is bound


def test_port_in_use(capsys):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        assert main(["serve", "--port", str(port), "--lang", "es"]) == 2
    assert f"el puerto {port} ya está en uso en 127.0.0.1" in capsys.readouterr().err


def test_listen_socket_binds_a_free_port():
    from cabe.web.app import listen_socket

    sock = listen_socket("127.0.0.1", _free())
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


def _free() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
