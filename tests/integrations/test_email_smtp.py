"""Email over an organization's SMTP server, against the loopback SMTP sandbox."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from crm.models import Organization
from integrations.email.smtp import SmtpConnection, SmtpServer
from integrations.models import EmailSettings
from project.sandboxes.smtp import SmtpSandbox


@pytest.fixture
def smtp():
    with SmtpSandbox(require_auth=("loja", "s3nha-smtp")) as server:
        yield server


def _message(to: str, n: int = 0) -> EmailMessage:
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = (
        "Loja <ofertas@loja.example.com.br>",
        to,
        f"Oferta {n}",
    )
    message["List-Unsubscribe"] = "<https://crm.example.com.br/u/abc>"
    message["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    message.set_content("texto")
    message.add_alternative("<p>html</p>", subtype="html")
    return message


def test_one_connection_carries_many_messages_and_returns_the_servers_answer(smtp):
    server = SmtpServer(smtp.host, smtp.port, "none", "loja", "s3nha-smtp")
    with SmtpConnection(server) as conn:
        answers = [conn.send(_message(f"c{i}@example.com.br", i)) for i in range(3)]
    assert all(a.startswith("250 ") and "queued as" in a for a in answers)
    assert smtp.connections() == 1
    received = smtp.messages(to="c1@example.com.br")[0]
    assert received["headers"]["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert "html" in received["html"] and "texto" in received["text"]
    assert "s3nha" not in repr(server)


def test_the_pool_asks_ready_only_once_the_connection_is_open_and_sends_nothing_on_no(smtp):
    """A rate limiter waits for its slot in `ready`: connecting and logging in come before it, so
    they never delay a message past its slot."""
    from integrations.email import pool

    server = SmtpServer(smtp.host, smtp.port, "none", "loja", "s3nha-smtp")
    pool.discard(server)
    seen: list[int] = []

    def ready(answer: bool):
        def check() -> bool:
            seen.append(smtp.connections())  # the session is open (and logged in) by now
            return answer

        return check

    try:
        assert pool.send(server, lambda: _message("no@example.com.br"), ready=ready(False)) is None
        assert smtp.messages() == []
        reply = pool.send(server, lambda: _message("yes@example.com.br"), ready=ready(True))
        assert reply is not None and reply.startswith("250 ")
    finally:
        pool.discard(server)
    assert seen == [1, 1]  # one connection, opened before the first question and kept for the second
    assert [m["rcpt_tos"] for m in smtp.messages()] == [["yes@example.com.br"]]


def test_a_refused_recipient_raises_with_the_code_and_the_session_goes_on(smtp):
    smtp.reply_for(
        "gone@example.com.br", 550, "5.1.1 <gone@example.com.br>: Recipient address rejected: User unknown"
    )
    with SmtpConnection(SmtpServer(smtp.host, smtp.port, "none", "loja", "s3nha-smtp")) as conn:
        with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
            conn.send(_message("gone@example.com.br"))
        assert refused.value.recipients["gone@example.com.br"][0] == 550
        assert conn.send(_message("ok@example.com.br")).startswith("250")
    assert smtp.connections() == 1


def test_wrong_credentials_fail_with_535(smtp):
    with pytest.raises(smtplib.SMTPAuthenticationError) as failure:
        SmtpConnection(SmtpServer(smtp.host, smtp.port, "none", "loja", "wrong")).open()
    assert failure.value.smtp_code == 535


def test_the_admin_test_email_reports_the_servers_answer_verbatim(db, client, smtp):
    org = Organization.objects.create(name="Loja", slug="loja")
    settings_ = EmailSettings(
        organization=org,
        host=smtp.host,
        port=smtp.port,
        security="none",
        username="loja",
        sender_name="Loja",
        sender_email="ofertas@loja.example.com.br",
    )
    settings_.set_password("s3nha-smtp")
    settings_.save()
    with connection.cursor() as cursor:
        cursor.execute("SELECT password_encrypted FROM integrations_emailsettings")
        assert "s3nha" not in cursor.fetchone()[0]
    user = get_user_model().objects.create_user(
        "ops", password="x-pw-12345", is_staff=True, is_superuser=True
    )
    client.force_login(user)
    url = "/admin/integrations/emailsettings/"
    page = client.post(url, {"action": "send_test_email", "_selected_action": [settings_.pk]}, follow=True)
    text = page.content.decode()
    assert "235" in text and "250 " in text and "queued as" in text
    assert smtp.messages(to="ofertas@loja.example.com.br")[0]["subject"] == "Teste de envio — CRM"

    settings_.set_password("wrong")
    settings_.save()
    page = client.post(url, {"action": "send_test_email", "_selected_action": [settings_.pk]}, follow=True)
    assert "sender" in page.content.decode() and "535" in page.content.decode()
