"""`manage.py up` checks its ports before it starts anything: a port still holding the last
connections of a run stopped a moment ago (TIME_WAIT) is free, one in use is not."""

from __future__ import annotations

import socket

import pytest
from django.core.management.base import CommandError

from project.management.commands.up import _check_port


def _listener() -> socket.socket:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn and aiohttp do
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def test_a_port_whose_connections_sit_in_time_wait_is_free():
    server = _listener()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its end of the connection enters TIME_WAIT
    client.recv(1)
    client.close()
    server.close()
    _check_port("127.0.0.1", port, "--port")  # does not raise


def test_a_port_in_use_is_refused_naming_the_option():
    server = _listener()
    try:
        with pytest.raises(CommandError, match=r"não é possível escutar em 127\.0\.0\.1:\d+ .*--erp-port"):
            _check_port("127.0.0.1", server.getsockname()[1], "--erp-port")  # LANGUAGE_CODE: pt-br
    finally:
        server.close()
