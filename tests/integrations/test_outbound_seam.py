"""One outbound seam, checked at the connection (integrations.outbound.peer_addresses): every client
that calls an address an organization, an operator or a setting chose — httpx, the send path's
POST pool, requests
inside anymail, smtplib — connects only to addresses the guard checked, on every redirect hop,
whatever notation names the host; redirects are not followed where an API never needs them, and
answers read from configured URLs are capped and shown only as a short excerpt."""

from __future__ import annotations

import asyncio
import ipaddress
import smtplib
import socket
import ssl
import threading
from email.message import EmailMessage

import httpx
import pytest
import requests
from aiohttp import web
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from crm.models import Organization
from integrations import http, http_pool, outbound
from integrations.email import esp
from integrations.email.bounces import Failure
from integrations.email.smtp import (
    SmtpConnection,
    SmtpHostRefused,
    SmtpServer,
    SmtpUnreachable,
    send_test_email,
)
from integrations.models import EmailSettings
from integrations.whatsapp.client import GraphClient, TemplateMessage
from integrations.whatsapp.errors import Action
from project.sandboxes.server import ThreadedAppServer
from project.sandboxes.smtp import SmtpSandbox


class _Internal(ThreadedAppServer):
    """A server inside the platform's network: records every request that reaches it."""

    thread_name = "internal"

    def __init__(self) -> None:
        super().__init__()
        self.hits: list[tuple[str, str, dict[str, str]]] = []
        self.lock = threading.Lock()

    def make_app(self) -> web.Application:
        async def anything(request: web.Request) -> web.Response:
            with self.lock:
                self.hits.append((request.method, request.path, dict(request.headers)))
            return web.Response(text="INTERNAL-SECRET " * 200, content_type="text/plain")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", anything)
        return app


class _Redirector(ThreadedAppServer):
    """A host an organization configured, answering every request with `status` to `location`
    (and a body that must never reach a page), or with `body` when there is no location."""

    thread_name = "redirector"

    def __init__(self, *, status: int = 307, location: str = "", body: bytes = b"") -> None:
        super().__init__()
        self.status, self.location, self.body = status, location, body

    def make_app(self) -> web.Application:
        async def anything(request: web.Request) -> web.Response:
            await request.read()
            headers = {"Location": self.location} if self.location else {}
            return web.Response(status=self.status, body=self.body or b"REDIRECT-BODY", headers=headers)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", anything)
        return app


@pytest.fixture
def strict(settings):
    """Production's setting: private addresses refused unless an operator trusted the origin."""
    settings.ALLOW_PRIVATE_OUTBOUND_URLS = False
    outbound._trusted = (0.0, frozenset())
    yield
    outbound._trusted = (0.0, frozenset())


@pytest.fixture
def internal():
    with _Internal() as server:
        yield server


@pytest.fixture(params=[302, 307])
def redirector(request, internal, strict):
    """A trusted (operator-named) loopback origin that redirects to the internal server's literal."""
    with _Redirector(status=request.param, location=f"{internal.url}/latest/meta-data") as server:
        outbound.trust_origin(server.url)
        yield server


def _mime() -> EmailMessage:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = "loja@example.com", "ana@example.com", "Oi"
    message.set_content("corpo")
    return message


@pytest.mark.django_db(transaction=True)
def test_the_esp_sender_never_follows_a_redirect_nor_shows_its_body(redirector, internal):
    """anymail over requests: a 3xx from the ESP API URL is a sender failure naming the status,
    the internal server never sees the POST (nor the token), and no body reaches the message."""
    result = esp.send(
        provider="postmark", api_key="server-token-xyz", api_url=f"{redirector.url}/", message=_mime()
    )
    assert internal.hits == []
    assert result.failure is not None and result.failure.kind is Failure.SENDER
    assert result.failure.code == redirector.status
    assert "REDIRECT-BODY" not in result.failure.message and "INTERNAL" not in result.failure.message
    assert "server-token-xyz" not in result.failure.message


@pytest.mark.django_db(transaction=True)
def test_the_graph_client_never_follows_a_redirect(redirector, internal):
    async def send():
        async with http.post_pool(redirector.url) as pool:
            client = GraphClient(pool=pool, version="v21.0")
            return await client.send_template(
                phone_number_id="123",
                access_token="graph-token",
                message=TemplateMessage(to="5511999999999", template="promo", language="pt_BR"),
            )

    result = asyncio.run(send())
    assert internal.hits == []
    assert result.error is not None and result.error.status == redirector.status
    assert result.action is Action.PAUSE_NUMBER


@pytest.mark.django_db(transaction=True)
def test_every_redirect_hop_is_checked_where_a_client_follows_them(redirector, internal):
    """The guard is at the connection: a client told to follow redirects is refused at the hop
    that would reach an inside address, not only at the first URL. The send path's pool follows
    none: a redirect is its answer."""
    with http.client(follow_redirects=True) as client, pytest.raises(outbound.OutboundURLError):
        client.post(f"{redirector.url}/hook", json={"a": 1})

    async def post() -> http_pool.Answer:
        async with http.post_pool(redirector.url) as pool:
            return await pool.post("/hook", b'{"a": 1}')

    assert asyncio.run(post()).status == redirector.status
    assert internal.hits == []


def _notations(address: ipaddress.IPv4Address) -> st.SearchStrategy[str]:
    """`address` in the notations a resolver or a URL parser accepts."""
    n = int(address)
    a, b, c, d = (int(x) for x in str(address).split("."))
    forms = [
        str(address),
        str(n),
        f"0x{n:x}",
        f"0{n:o}",
        ".".join(f"0{x:o}" for x in (a, b, c, d)),
        ".".join(f"0x{x:x}" for x in (a, b, c, d)),
        f"{a}.{(b << 16) | (c << 8) | d}",  # 127.1
        f"{a}.{b}.{(c << 8) | d}",
        f"0x{a:x}.{(b << 16) | (c << 8) | d}",  # 0x7f.1
        f"::ffff:{address}",
        f"[::ffff:{address}]",
        f"::ffff:{n >> 16:x}:{n & 0xFFFF:x}",
        f"64:ff9b::{address}",
    ]
    return st.sampled_from(forms)


async def _pool_post(url: str) -> None:
    async with http.post_pool(url) as pool:
        await pool.post("/", b"{}")


def _loopback_addresses() -> st.SearchStrategy[ipaddress.IPv4Address]:
    return st.integers(0, 2**24 - 1).map(lambda i: ipaddress.IPv4Address(0x7F000000 + i))


@pytest.mark.django_db(transaction=True)
@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_private_address_in_any_notation_never_gets_a_connection(strict, data):
    """Through the connection-level guard (every client's sockets): loopback in any notation —
    decimal, octal, hex, short forms, IPv4-mapped and NAT64 IPv6 — is refused before a packet."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0)
    port = listener.getsockname()[1]
    loopback = _notations(ipaddress.IPv4Address("127.0.0.1")) | _loopback_addresses().flatmap(_notations)
    host = data.draw(loopback)
    try:
        with pytest.raises(outbound.OutboundURLError):
            outbound.create_connection((host, port), 2.0)
        with pytest.raises(smtplib.SMTPConnectError):
            SmtpConnection(SmtpServer(host, port, "none")).open()
        url_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        url = f"http://{url_host}:{port}/"
        # Each HTTP client either refuses the notation as a URL or the guard refuses its address.
        with http.client() as client, pytest.raises((outbound.OutboundURLError, httpx.InvalidURL)):
            client.get(url)
        with pytest.raises((outbound.OutboundURLError, requests.exceptions.InvalidURL)):
            http.requests_session().get(url)
        with pytest.raises((outbound.OutboundURLError, ValueError)):
            asyncio.run(_pool_post(url))
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "0177.0.0.1", "127.1", "2130706433", "::1"])
def test_the_smtp_host_is_guarded(strict, host):
    with SmtpSandbox() as sandbox:
        port = sandbox.address[1]
        server = SmtpServer(host, port, "none")
        with pytest.raises(SmtpHostRefused):
            send_test_email(server, sender="loja@example.com", to="loja@example.com")
        assert sandbox.messages() == []


def _closed_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


def test_refused_and_a_foreign_service_give_one_smtp_error(settings):
    """The test email is no port scanner: a closed port and an open one that is not SMTP answer
    the same line."""
    banner = socket.socket()
    banner.bind(("127.0.0.1", 0))
    banner.listen(1)
    port = banner.getsockname()[1]

    def serve() -> None:
        conn, _ = banner.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    errors = []
    for target in (_closed_port(), port):
        with pytest.raises(SmtpUnreachable) as error:
            server = SmtpServer("127.0.0.1", target, "none")
            send_test_email(server, sender="a@example.com", to="a@example.com")
        errors.append(str(error.value).replace(str(target), "PORT"))
    thread.join(10)
    banner.close()
    assert errors[0] == errors[1]


def test_answers_are_capped(settings):
    with _Redirector(status=200, body=b"x" * 5000) as server:
        with http.client(max_response_bytes=4096) as client, pytest.raises(http.ResponseTooLarge):
            client.get(server.url)
        with http.client(max_response_bytes=8192) as client:
            assert len(client.get(server.url).content) == 5000
        session = http.requests_session(max_response_bytes=4096)
        with pytest.raises(http.RequestsResponseTooLarge):
            session.get(server.url)
    with _Redirector(status=200, body=b"y" * 300_000) as server:  # many chunks: read whole, or refused

        async def read(limit: int) -> bytes:
            async with http.post_pool(server.url, max_body=limit) as pool:
                return (await pool.post("/", b"{}")).body

        assert len(asyncio.run(read(400_000))) == 300_000
        with pytest.raises(http_pool.AnswerTooLarge):
            asyncio.run(read(200_000))


def test_an_esp_error_body_is_a_short_excerpt(settings):
    body = ("<html><script>alert(1)</script>" + "erro " * 2000 + "</html>").encode()
    with _Redirector(status=422, body=body) as server:
        result = esp.send(provider="postmark", api_key="k", api_url=f"{server.url}/", message=_mime())
    assert result.failure is not None
    assert len(result.failure.message) <= 400


def test_httpx_transport_keeps_the_name_for_the_host_header(settings):
    """Connecting to checked addresses keeps the request's own Host header (virtual hosts work)."""
    with _Redirector(status=200, body=b"ok") as server:
        url = server.url.replace("127.0.0.1", "localhost")
        with http.client() as client:
            response = client.get(url)
        assert response.status_code == 200
        assert response.request.headers["Host"] == f"localhost:{server.url.rsplit(':', 1)[1]}"


@pytest.mark.django_db
def test_a_private_smtp_host_is_refused_when_saved(strict):
    org = Organization.objects.create(name="Loja", slug="loja")

    def row(host: str) -> EmailSettings:
        return EmailSettings(
            organization=org, host=host, port=587, sender_name="Loja", sender_email="loja@example.com"
        )

    for host in (
        "127.0.0.1",
        "localhost",
        "0177.0.0.1",
        "127.1",
        "10.1.2.3",
        "[::1]",
        "::ffff:169.254.169.254",
    ):
        with pytest.raises(ValidationError) as error:
            row(host).full_clean()
        assert "host" in error.value.message_dict
    row("8.8.8.8").full_clean()


@pytest.mark.django_db(transaction=True)
def test_the_admin_test_email_through_a_redirecting_esp_shows_no_inside_body(client, redirector, internal):
    """The attack as a manager would try it: the ESP API URL answers 3xx to an inside address;
    "send a test email" reaches nothing inside and the page shows none of either body."""
    org = Organization.objects.create(name="Loja", slug="loja")
    row = EmailSettings(
        organization=org,
        provider=EmailSettings.Provider.POSTMARK,
        esp_api_url=f"{redirector.url}/",
        sender_name="Loja",
        sender_email="ofertas@loja.example.com.br",
    )
    row.set_esp_api_key("server-token-xyz")
    row.save()
    user = get_user_model().objects.create_user(
        "ops", password="x-pw-12345", is_staff=True, is_superuser=True
    )
    client.force_login(user)
    page = client.post(
        "/admin/integrations/emailsettings/",
        {"action": "send_test_email", "_selected_action": [row.pk]},
        follow=True,
    )
    text = page.content.decode()
    assert page.status_code == 200
    assert f"HTTP {redirector.status}" in text
    assert "INTERNAL-SECRET" not in text and "REDIRECT-BODY" not in text
    assert internal.hits == []


def test_every_client_shares_one_certificate_checking_context():
    # Loading the CA bundle costs tens of ms of CPU: once per process, not twice per client.
    with http.client() as first, http.client() as second:
        contexts = {id(c._transport._pool._ssl_context) for c in (first, second)}
    assert contexts == {id(http.ssl_context())}
    assert http.ssl_context().verify_mode == ssl.CERT_REQUIRED and http.ssl_context().check_hostname
