"""The SMTP sandbox, driven by Python's smtplib over real loopback sockets."""

from __future__ import annotations

import os
import signal
import smtplib
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path

import pytest

from project.sandboxes.smtp import SmtpSandbox
from tests.tls import self_signed

ROOT = Path(__file__).resolve().parents[2]
SENDER = "loja@example.com"
ALICE = "alice@example.net"
BOB = "bob@example.net"
USER_UNKNOWN = "5.1.1 <bob@example.net>: Recipient address rejected: User unknown"


@pytest.fixture
def sandbox() -> Iterator[SmtpSandbox]:
    with SmtpSandbox() as server:
        yield server


@pytest.fixture
def client(sandbox: SmtpSandbox) -> Iterator[smtplib.SMTP]:
    with smtplib.SMTP(*sandbox.address, timeout=60) as smtp:
        yield smtp


def newsletter(to: str = ALICE, subject: str = "Ofertas de novembro") -> EmailMessage:
    message = EmailMessage()
    message["From"] = SENDER
    message["To"] = to
    message["Subject"] = subject
    message["List-Unsubscribe"] = "<https://crm.example.com/u/abc123>, <mailto:unsub@example.com>"
    message["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    message.set_content("Olá! Confira as ofertas.")
    message.add_alternative("<p>Olá! Confira as <b>ofertas</b>.</p>", subtype="html")
    return message


def test_it_stores_a_multipart_message_with_its_headers_and_both_bodies(
    sandbox: SmtpSandbox, client: smtplib.SMTP
) -> None:
    assert client.send_message(newsletter()) == {}

    [stored] = sandbox.messages()
    assert stored["mail_from"] == SENDER
    assert stored["rcpt_tos"] == [ALICE]
    assert stored["subject"] == "Ofertas de novembro"
    assert stored["headers"]["List-Unsubscribe"] == (
        "<https://crm.example.com/u/abc123>, <mailto:unsub@example.com>"
    )
    assert stored["headers"]["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert stored["message"].get_content_type() == "multipart/alternative"
    assert stored["text"].strip() == "Olá! Confira as ofertas."
    assert stored["html"].strip() == "<p>Olá! Confira as <b>ofertas</b>.</p>"
    assert b"List-Unsubscribe-Post: List-Unsubscribe=One-Click" in stored["raw"]
    assert stored["received_at"].tzinfo is not None
    assert stored["connection_id"] is not None
    assert sandbox.messages(to=ALICE.upper()) == [stored]
    assert sandbox.messages(to=BOB) == []


def test_messages_over_one_connection_count_as_one_connection(sandbox: SmtpSandbox) -> None:
    with smtplib.SMTP(*sandbox.address, timeout=60) as smtp:
        for to in (ALICE, BOB, ALICE):
            smtp.send_message(newsletter(to=to))
    with smtplib.SMTP(*sandbox.address, timeout=60) as smtp:
        smtp.send_message(newsletter(to=BOB))

    assert sandbox.connections() == 2
    assert sorted(sandbox.messages_per_connection().values()) == [1, 3]
    first, *_, last = sandbox.messages()
    assert first["connection_id"] != last["connection_id"]
    assert len(sandbox.messages(to=ALICE)) == 2


def test_a_recipient_rejected_at_rcpt_raises_with_the_code_and_text(
    sandbox: SmtpSandbox, client: smtplib.SMTP
) -> None:
    sandbox.reply_for(BOB, 550, USER_UNKNOWN)

    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        client.send_message(newsletter(to=BOB))

    assert refused.value.recipients == {BOB: (550, USER_UNKNOWN.encode())}
    assert sandbox.messages() == []


def test_a_rejected_recipient_does_not_stop_the_others(sandbox: SmtpSandbox, client: smtplib.SMTP) -> None:
    sandbox.reply_for(BOB, 550, USER_UNKNOWN)

    refused = client.sendmail(SENDER, [ALICE, BOB], newsletter().as_bytes())

    assert refused == {BOB: (550, USER_UNKNOWN.encode())}
    [stored] = sandbox.messages()
    assert stored["rcpt_tos"] == [ALICE]


def test_a_data_stage_452_raises_data_error_and_stores_nothing(
    sandbox: SmtpSandbox, client: smtplib.SMTP
) -> None:
    sandbox.reply_for(ALICE, 452, "4.2.2 Mailbox full", at="DATA")

    with pytest.raises(smtplib.SMTPDataError) as error:
        client.send_message(newsletter())

    assert (error.value.smtp_code, error.value.smtp_error) == (452, b"4.2.2 Mailbox full")
    assert sandbox.messages() == []
    # The session survives a failed transaction.
    client.send_message(newsletter(to=BOB))
    assert len(sandbox.messages(to=BOB)) == 1


def test_a_reply_for_one_time_lets_the_second_attempt_through(
    sandbox: SmtpSandbox, client: smtplib.SMTP
) -> None:
    sandbox.reply_for(ALICE, 451, "4.7.1 Greylisted, try again later", times=1)

    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        client.send_message(newsletter())
    assert refused.value.recipients[ALICE][0] == 451
    client.send_message(newsletter())

    assert len(sandbox.messages(to=ALICE)) == 1
    assert sandbox.replies() == []


def test_a_421_closes_the_connection(sandbox: SmtpSandbox) -> None:
    sandbox.reply_for(ALICE, 421, "4.7.0 Try again later")

    with smtplib.SMTP(*sandbox.address, timeout=60) as smtp:
        with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
            smtp.send_message(newsletter())
        assert refused.value.recipients[ALICE] == (421, b"4.7.0 Try again later")
        with pytest.raises(smtplib.SMTPServerDisconnected):
            smtp.noop()
    assert sandbox.messages() == []


def test_the_server_hangs_up_after_a_421(sandbox: SmtpSandbox) -> None:
    # smtplib closes its side on a 421 anyway; a raw socket shows the server closed too.
    sandbox.reply_for(ALICE, 421, "4.7.0 Try again later")
    with socket.create_connection(sandbox.address, timeout=60) as raw:
        stream = raw.makefile("rb")
        stream.readline()
        raw.sendall(f"HELO client\r\nMAIL FROM:<{SENDER}>\r\nRCPT TO:<{ALICE}>\r\n".encode())
        replies = [stream.readline() for _ in range(3)]
        assert replies[-1] == b"421 4.7.0 Try again later\r\n"
        assert stream.readline() == b""


def test_a_global_reply_refuses_every_sender(sandbox: SmtpSandbox, client: smtplib.SMTP) -> None:
    sandbox.reply_for_all(554, "5.7.1 Service unavailable; client host blocked", at="MAIL", times=2)

    for to in (ALICE, BOB):
        with pytest.raises(smtplib.SMTPSenderRefused) as refused:
            client.send_message(newsletter(to=to))
        assert refused.value.smtp_code == 554
    client.send_message(newsletter())

    assert [m["rcpt_tos"] for m in sandbox.messages()] == [[ALICE]]


def test_the_right_credentials_are_accepted() -> None:
    with (
        SmtpSandbox(require_auth=("crm", "s3cret")) as sandbox,
        smtplib.SMTP(*sandbox.address, timeout=60) as smtp,
    ):
        code, _ = smtp.login("crm", "s3cret")
        smtp.send_message(newsletter())

    assert code == 235
    assert [m["auth_login"] for m in sandbox.messages()] == ["crm"]


def test_wrong_credentials_get_535_and_no_mail_goes_through() -> None:
    with (
        SmtpSandbox(require_auth=("crm", "s3cret")) as sandbox,
        smtplib.SMTP(*sandbox.address, timeout=60) as smtp,
    ):
        with pytest.raises(smtplib.SMTPAuthenticationError) as error:
            smtp.login("crm", "wrong")
        with pytest.raises(smtplib.SMTPSenderRefused) as refused:
            smtp.send_message(newsletter())

    assert error.value.smtp_code == 535
    assert b"5.7.8" in error.value.smtp_error
    assert refused.value.smtp_code == 530
    assert sandbox.messages() == []


def test_a_scripted_535_refuses_even_the_right_credentials() -> None:
    with SmtpSandbox(require_auth=("crm", "s3cret")) as sandbox:
        # No `times`: smtplib's login() tries every mechanism the server offers (PLAIN, then LOGIN).
        sandbox.reply_for_all(535, "5.7.8 Authentication credentials invalid", at="AUTH")
        with (
            smtplib.SMTP(*sandbox.address, timeout=60) as smtp,
            pytest.raises(smtplib.SMTPAuthenticationError) as error,
        ):
            smtp.login("crm", "s3cret")
        sandbox.reset()
        with smtplib.SMTP(*sandbox.address, timeout=60) as smtp:
            assert smtp.login("crm", "s3cret")[0] == 235

    assert (error.value.smtp_code, error.value.smtp_error) == (
        535,
        b"5.7.8 Authentication credentials invalid",
    )


def test_starttls_upgrades_the_session_without_counting_a_new_connection(tmp_path: Path) -> None:
    client_context = ssl.create_default_context()
    client_context.check_hostname = False
    client_context.verify_mode = ssl.CERT_NONE
    with (
        SmtpSandbox(starttls_context=self_signed(tmp_path)[1]) as sandbox,
        smtplib.SMTP(*sandbox.address, timeout=60) as smtp,
    ):
        assert smtp.starttls(context=client_context)[0] == 220
        smtp.send_message(newsletter())

    [stored] = sandbox.messages()
    assert sandbox.connections() == 1
    assert sandbox.messages_per_connection() == {stored["connection_id"]: 1}


def test_reset_forgets_messages_connections_and_replies(sandbox: SmtpSandbox, client: smtplib.SMTP) -> None:
    client.send_message(newsletter())
    sandbox.reply_for(BOB, 550, USER_UNKNOWN)

    sandbox.reset()

    assert (sandbox.messages(), sandbox.connections(), sandbox.replies()) == ([], 0, [])
    client.send_message(newsletter(to=BOB))
    assert len(sandbox.messages(to=BOB)) == 1


def test_it_refuses_a_reply_that_is_not_a_failure(sandbox: SmtpSandbox) -> None:
    with pytest.raises(ValueError):
        sandbox.reply_for(ALICE, 250, "2.0.0 Ok")
    with pytest.raises(ValueError):
        sandbox.reply_for(ALICE, 550, "5.1.1 Unknown", times=0)
    assert sandbox.replies() == []


def test_the_management_command_serves_until_sigterm() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "smtp_sandbox", "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "LANGUAGE_CODE": "en"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        output = []
        for line in proc.stdout:
            output.append(line)
            if "listening on" in line:
                break
        assert f"SMTP sandbox listening on 127.0.0.1:{port} (Ctrl-C to stop)" in output[-1], "".join(output)
        with smtplib.SMTP("127.0.0.1", port, timeout=60) as smtp:
            assert smtp.send_message(newsletter()) == {}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_held_data_waits_unstored_and_unanswered_until_released(sandbox: SmtpSandbox) -> None:
    import threading

    from tests.conftest import wait_for

    sandbox.hold()
    answers: list[object] = []

    def send() -> None:
        with smtplib.SMTP(*sandbox.address, timeout=120) as smtp:
            answers.append(smtp.send_message(newsletter()))

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    wait_for(lambda: sandbox.held() == 1, timeout=120, what="the DATA to be held")
    assert sandbox.messages() == [] and answers == []  # neither stored nor answered while held
    sandbox.release()
    sender.join(timeout=120)
    assert answers == [{}] and len(sandbox.messages(to=ALICE)) == 1 and sandbox.held() == 0
