"""The SSRF guard (integrations/outbound.py): what organizations and operators configure never
reaches the platform's own network, unless the deployment allows it or an operator trusted it."""

from __future__ import annotations

import ipaddress
import socket
from io import StringIO

import httpx
import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from crm.models import Organization
from erp.models import ErpConnection
from integrations import http, outbound
from integrations.models import ChatwootAccount

PRIVATE_V4 = [
    ipaddress.IPv4Network(n)
    for n in ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "0.0.0.0/8")
]
PUBLIC_V4 = ["8.8.8.8", "1.1.1.1", "200.147.67.142", "151.101.1.69"]


@pytest.fixture(autouse=True)
def _strict(settings):
    settings.ALLOW_PRIVATE_OUTBOUND_URLS = False
    outbound._trusted = (0.0, frozenset())
    yield
    outbound._trusted = (0.0, frozenset())


def private_v4() -> st.SearchStrategy[ipaddress.IPv4Address]:
    return st.sampled_from(PRIVATE_V4).flatmap(
        lambda net: st.integers(0, net.num_addresses - 1).map(lambda i: net[i])
    )


def _no_dns(host: str) -> list[str]:
    raise AssertionError(f"{host} should not need a lookup")


@hsettings(max_examples=200, deadline=None)
@given(private_v4(), st.sampled_from(["dotted", "decimal", "octal", "hex", "mapped", "mapped-hex"]))
def test_private_ipv4_in_any_spelling_is_refused(address, form):
    """Literals are judged by the address they mean: decimal, octal, hex, IPv4-mapped IPv6."""
    n = int(address)
    host = {
        "dotted": str(address),
        "decimal": str(n),
        "octal": ".".join(f"0{int(b):o}" for b in str(address).split(".")),
        "hex": f"0x{n:08x}",
        "mapped": f"[::ffff:{address}]",
        "mapped-hex": f"[::ffff:{n >> 16:x}:{n & 0xFFFF:x}]",
    }[form]
    with pytest.raises(outbound.OutboundURLError):
        outbound.check_url(f"http://{host}:8080/path")


@hsettings(max_examples=100, deadline=None)
@given(
    st.sampled_from(["::1", "fe80::1", "fc00::5", "fd12:3456::1", "ff02::1", "::", "2001:db8::1"]),
    st.sampled_from(["http", "https"]),
)
def test_private_and_special_ipv6_literals_are_refused(address, scheme):
    with pytest.raises(outbound.OutboundURLError):
        outbound.check_url(f"{scheme}://[{address}]/x", resolver=_no_dns)


@hsettings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from(PUBLIC_V4), min_size=0, max_size=3),
    private_v4(),
    st.integers(0, 3),
    st.from_regex(r"[a-z][a-z0-9-]{0,20}\.example\.com\.br", fullmatch=True),
)
def test_a_name_with_any_private_address_among_its_addresses_is_refused(public, private, at, name):
    """Every resolved address is checked: one private among public ones is enough to refuse."""
    addresses = [*public]
    addresses.insert(min(at, len(addresses)), str(private))
    with pytest.raises(outbound.OutboundURLError):
        outbound.check_url(f"https://{name}/api", resolver=lambda host: addresses)
    outbound.check_url(f"https://{name}/api", resolver=lambda host: public or ["8.8.4.4"])


@hsettings(max_examples=100, deadline=None)
@given(st.sampled_from(PUBLIC_V4))
def test_public_addresses_pass_in_every_spelling(address):
    n = int(ipaddress.ip_address(address))
    for host in (address, str(n), f"0x{n:08x}", f"[::ffff:{address}]"):
        outbound.check_url(f"https://{host}/")


def test_schemes_hosts_and_names_that_do_not_resolve(english):
    for url in (
        "ftp://8.8.8.8/",
        "file:///etc/passwd",
        "gopher://x/",
        "https:///nohost",
        "javascript:alert(1)",
    ):
        with pytest.raises(outbound.OutboundURLError):
            outbound.check_url(url)
    with pytest.raises(outbound.OutboundURLError, match="does not resolve"):
        outbound.check_url("https://nowhere.invalid/")
    with pytest.raises(outbound.OutboundURLError):
        outbound.check_url("http://localhost:8000/")  # resolved: loopback


def test_the_deployment_setting_allows_private_urls(settings):
    settings.ALLOW_PRIVATE_OUTBOUND_URLS = True
    outbound.check_url("http://127.0.0.1:8080/")
    outbound.check_request_url("http://10.0.0.5/")


@pytest.mark.django_db
def test_configured_urls_are_refused_when_saved(settings):
    org = Organization.objects.create(name="Loja", slug="loja")
    for url in ("http://127.0.0.1:8082", "http://169.254.169.254/latest/meta-data", "http://[::1]/"):
        with pytest.raises(ValidationError) as error:
            ErpConnection(organization=org, base_url=url, username="u").full_clean()
        assert "base_url" in error.value.message_dict
        with pytest.raises(ValidationError):
            ChatwootAccount(organization=org, base_url=url, account_id=1, inbox_id=1).full_clean()
    ErpConnection(organization=org, base_url="https://8.8.8.8", username="u").full_clean()


@pytest.mark.django_db(transaction=True)
def test_the_http_seam_refuses_at_request_time_and_trusted_origins_pass(settings):
    """A URL saved before (or a name that now resolves inside) is refused when the request leaves;
    an origin an operator named on the command line is called even on loopback."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        with http.client() as client, pytest.raises(outbound.OutboundURLError):
            client.get(f"http://127.0.0.1:{port}/")
        outbound.trust_origin(f"http://127.0.0.1:{port}/anything")
        with http.client(timeout=httpx.Timeout(0.5)) as client, pytest.raises(httpx.TimeoutException):
            client.get(f"http://127.0.0.1:{port}/")  # let through: the server never answers
        with http.client() as client, pytest.raises(outbound.OutboundURLError):
            client.get(f"http://127.0.0.1:{port + 1 if port < 65535 else port - 1}/")  # another origin
    finally:
        server.close()


@pytest.mark.django_db(transaction=True)
def test_the_async_seam_refuses_too():
    import asyncio

    async def fetch() -> None:
        async with http.post_pool("http://169.254.169.254/latest") as pool:
            await pool.post("/meta-data", b"{}")

    with pytest.raises(outbound.OutboundURLError):
        asyncio.run(fetch())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("url", ["ftp://8.8.8.8/", "file:///etc/passwd", "gopher://x/", "https:///nohost"])
def test_the_async_seam_sends_nothing_but_http_and_https(url, settings):
    settings.ALLOW_PRIVATE_OUTBOUND_URLS = True  # the scheme alone refuses them
    with pytest.raises(outbound.OutboundURLError):
        http.post_pool(url)


@pytest.mark.django_db(transaction=True)
def test_the_async_seam_refuses_a_scheme_a_client_would_connect_for(settings):
    settings.ALLOW_PRIVATE_OUTBOUND_URLS = True
    with socket.socket() as listener:  # something listens: only the guard keeps the request in
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0)
        for scheme in ("ws", "wss"):
            with pytest.raises(outbound.OutboundURLError):
                http.post_pool(f"{scheme}://127.0.0.1:{listener.getsockname()[1]}/")
        with pytest.raises(BlockingIOError):
            listener.accept()


@pytest.mark.django_db
def test_demo_urls_named_on_the_command_line_work_against_loopback(settings, tmp_path, monkeypatch):
    settings.VAR_DIR = tmp_path
    call_command(
        "demo",
        customers=1,
        graph_url="http://127.0.0.1:8081",
        erp_url="http://127.0.0.1:8082",
        smtp=("127.0.0.1", 2525),
        stdout=StringIO(),
    )
    assert outbound.trusted_host("127.0.0.1", 2525)
    assert outbound.peer_addresses("127.0.0.1", 2525) == ["127.0.0.1"]
    assert {"http://127.0.0.1:8081", "http://127.0.0.1:8082"} <= outbound.trusted_origins()
    connection = ErpConnection.objects.get(organization__slug="demo")
    connection.full_clean()  # an operator's choice stays valid when the organization saves it
    outbound.check_request_url("http://127.0.0.1:8082/api/millenium/clientes")


class _Rebinding:
    """A name server for `rebind.example` that answers a public address first and the platform's
    own loopback ever after (DNS rebinding)."""

    def __init__(self) -> None:
        self.answers = 0

    def __call__(self, host: str, *args, **kwargs):
        self.answers += 1
        return "8.8.8.8" if self.answers == 1 else "127.0.0.1"


def _listener() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    return server


def _connected(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
    except OSError:
        return False
    return True


@pytest.mark.django_db(transaction=True)
def test_a_name_that_rebinds_to_loopback_after_the_check_never_connects_there(monkeypatch):
    """The httpx seam connects to the addresses of the lookup it checked: a name that answers a
    public address first and loopback next is refused at the connection that would go inside, so
    nothing reaches the server listening there."""
    server = _listener()
    port = server.getsockname()[1]
    dns = _Rebinding()
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):  # every lookup in the process, the guard's and httpx's
        return real(dns(host) if host == "rebind.example" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    try:
        with http.client(timeout=httpx.Timeout(0.5)) as client, pytest.raises(httpx.TransportError):
            client.get(f"http://rebind.example:{port}/")  # 8.8.8.8 on a port nobody answers
        for _ in range(3):
            with http.client(timeout=httpx.Timeout(0.5)) as client, pytest.raises(outbound.OutboundURLError):
                client.get(f"http://rebind.example:{port}/")  # now loopback: refused, not connected
        assert dns.answers == 4  # one lookup per connection, and that lookup is the one checked
        assert not _connected(server)
    finally:
        server.close()


@pytest.mark.django_db(transaction=True)
def test_the_async_seam_refuses_a_name_at_the_lookup_it_connects_with(monkeypatch):
    import asyncio

    server = _listener()
    port = server.getsockname()[1]

    async def fetch(url: str) -> None:
        async with http.post_pool(url) as pool:
            await pool.post("/", b"{}")

    try:
        with pytest.raises(outbound.OutboundURLError, match="localhost"):
            asyncio.run(fetch(f"http://localhost:{port}/"))  # resolves to loopback
        assert not _connected(server)
        outbound.trust_origin(f"http://localhost:{port}/")
        outbound._trusted = (0.0, frozenset())
        with pytest.raises(TimeoutError):
            asyncio.run(asyncio.wait_for(fetch(f"http://localhost:{port}/"), 0.5))  # let through
        assert _connected(server)
    finally:
        server.close()


@pytest.mark.django_db(transaction=True)
def test_the_guard_leaves_no_database_session_open_in_a_helper_thread(settings):
    """The trusted origins are read wherever a connection is checked, also in threads no request or
    job ever closes (an event loop's executor, the email senders' pool): those keep no session."""
    import threading

    from django.db import connection

    settings.ALLOW_PRIVATE_OUTBOUND_URLS = False
    outbound.trust_origin("http://127.0.0.1:9")  # forgets the cached origins: the next check reads them
    seen: list[object] = []

    def check() -> None:
        seen.append(outbound.trusted_host("127.0.0.1", 9))
        seen.append(connection.connection)

    thread = threading.Thread(target=check)
    thread.start()
    thread.join(timeout=60)
    assert seen == [True, None]
