"""SMTP failure classification: real-world replies and exceptions in, hard/soft/sender decisions out."""

from __future__ import annotations

import smtplib
import socket
import ssl

import pytest

from integrations.email.bounces import (
    BounceType,
    Failure,
    SmtpFailure,
    classify_esp_bounce,
    classify_exception,
    classify_reply,
    esp_event_markers,
    parse_reply,
)

HARD, SOFT, SENDER, BLOCKED = Failure.HARD_BOUNCE, Failure.SOFT_BOUNCE, Failure.SENDER, Failure.BLOCKED

GMAIL_NO_SUCH_USER = (
    "550-5.1.1 The email account that you tried to reach does not exist. Please try\n"
    "550-5.1.1 double-checking the recipient's email address for typos or\n"
    "550-5.1.1 unnecessary spaces. For more information, go to\n"
    "550 5.1.1  https://support.google.com/mail/?p=NoSuchUser a1si123456qkb.12 - gsmtp"
)
GMAIL_OVER_QUOTA = (
    "452-4.2.2 The recipient's inbox is out of storage space. Please direct the\n"
    "452-4.2.2 recipient to\n"
    "452 4.2.2  https://support.google.com/mail/?p=OverQuotaTemp b2si - gsmtp"
)
GMAIL_BAD_CREDENTIALS = (
    "535-5.7.8 Username and Password not accepted. For more information, go to\n"
    "535 5.7.8  https://support.google.com/mail/?p=BadCredentials x1sm - gsmtp"
)


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        # Gmail
        (GMAIL_NO_SUCH_USER, HARD),
        (GMAIL_OVER_QUOTA, SOFT),
        (GMAIL_BAD_CREDENTIALS, SENDER),
        ("550 5.2.1 The email account that you tried to reach is disabled. - gsmtp", HARD),
        ("550 5.7.1 [203.0.113.9] Our system has detected that this message is likely spam.", BLOCKED),
        ("450 4.2.1 The user you are trying to contact is receiving mail too quickly. - gsmtp", SOFT),
        ("421 4.7.0 Try again later, closing connection. (EHLO) - gsmtp", SENDER),
        ("530 5.7.0 Must issue a STARTTLS command first. - gsmtp", SENDER),
        ("534 5.7.14 Please log in via your web browser and then try again. - gsmtp", SENDER),
        # Outlook / Microsoft 365
        ("550 5.5.0 Requested action not taken: mailbox unavailable (S2017062302).", HARD),
        (
            "550 5.4.1 Recipient address rejected: Access denied. AS(201806281) [CO1NAM11FT012.eop-nam11]",
            HARD,
        ),
        ("552 5.2.2 Mailbox full; STOREDRV.Deliver.Exception:QuotaExceededException", SOFT),
        ("550 5.7.1 Unable to relay for fulano@empresa.com.br", SENDER),
        (
            "535 5.7.139 Authentication unsuccessful, SmtpClientAuthentication is disabled for the Tenant.",
            SENDER,
        ),
        ("451 4.4.0 DNS query failed. The error was: SMTPSEND.DnsQueryFailure; nonexistent domain", SOFT),
        ("550 5.1.10 RESOLVER.ADR.RecipientNotFound; Recipient not found by SMTP address lookup", HARD),
        # Yahoo / AOL
        ("554 delivery error: dd This user doesn't have a yahoo.com account (x@yahoo.com) [0]", HARD),
        ("552 1 Requested mail action aborted, mailbox not found", HARD),
        ("421 4.7.0 [TSS04] Messages from 203.0.113.9 temporarily deferred due to unexpected volume", SENDER),
        ("452 4.2.2 Mailbox over quota", SOFT),
        # Postfix
        ("550 5.1.1 <a@b.com>: Recipient address rejected: User unknown in local recipient table", HARD),
        ("550 5.1.1 <a@b.com>: Recipient address rejected: User unknown in relay recipient table", HARD),
        ("554 5.7.1 <a@b.com>: Relay access denied", SENDER),
        ("450 4.1.8 <x@y.com>: Sender address rejected: Domain not found", SOFT),
        (
            "451 4.7.1 <a@b.com>: Recipient address rejected: Greylisted, see http://postgrey.schweikert.ch/",
            SOFT,
        ),
        ("550 5.1.2 <a@nowhere.invalid>: Recipient address rejected: Domain not found", HARD),
        ("454 4.7.0 TLS not available due to local problem", SENDER),
        ("450 4.7.1 Client host rejected: cannot find your hostname, [203.0.113.9]", SOFT),
        # Exim
        ("550 relay not permitted", SENDER),
        ("550 Unrouteable address", HARD),
        ("451 Temporary local problem - please try later", SOFT),
        ("550-Verification failed for <a@b.com>\n550 Sender verify failed", HARD),
        ("550 5.1.6 Recipient addresses has moved", HARD),
        # UOL / BOL / Terra / Locaweb-style Portuguese
        ("550 5.1.1 Usuário desconhecido / unknown user", HARD),
        ("552 Caixa postal cheia - mailbox full", SOFT),
        ("550 Caixa postal inexistente", HARD),
        ("550 O endereço de destino não existe", HARD),
        ("450 Caixa cheia, tente novamente mais tarde", SOFT),
        ("554 Cota de armazenamento excedida", SOFT),
        ("530 Autenticação necessária", SENDER),
        # Precedence: sender-side over the code ranges, enhanced over the bare code.
        ("550 5.2.2 mailbox full", SOFT),
        ("452 5.1.1 user unknown", HARD),
        ("550 4.2.2 mailbox temporarily full", SOFT),
        ("421 5.1.1 closing channel", SENDER),
        ("550 5.7.8 Error: authentication failed", SENDER),
        ("550 Mailbox is full", SOFT),
        ("550 Please try again later", SOFT),
        ("450 Requested mail action not taken: mailbox unavailable", SOFT),
        # No code at all, and unknown replies.
        ("User unknown", HARD),
        ("no such user here", HARD),
        ("Something went wrong", SOFT),
        ("", SOFT),
        ("599 weird", HARD),
        ("499 weird", SOFT),
        ("550 host 200.4.1.20 blocked", BLOCKED),  # not a "4.1.20" enhanced status (that would be soft)
    ],
)
def test_it_classifies_a_real_world_reply(reply: str, kind: Failure) -> None:
    assert classify_reply(None, reply).kind is kind


# Policy blocks say nothing about the address: the IP, the domain's reputation, the content.
@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        ("550 5.7.1 Service unavailable; client host [203.0.113.9] blocked using Spamhaus", BLOCKED),
        ("554 5.7.1 Service unavailable; Client host [203.0.113.9] blocked using bl.spamcop.net", BLOCKED),
        ("554 5.7.1 <c@example.com.br>: Message rejected due to policy", BLOCKED),
        (
            "550 5.7.1 Unfortunately, messages from [203.0.113.9] weren't sent. Please contact your Internet "
            "service provider since part of their network is on our block list (S3150).",
            BLOCKED,
        ),
        ("550 5.7.606 Access denied, banned sending IP [203.0.113.9]", BLOCKED),  # Microsoft
        ("550-5.7.26 This mail is unauthenticated, which poses a security risk", BLOCKED),  # Gmail DMARC
        ("552 5.7.0 This message was blocked because its content presents a security issue", BLOCKED),
        ("553 5.7.1 [BL21] Connections will not be accepted from 203.0.113.9", BLOCKED),  # Yahoo
        ("550 Rejected: 203.0.113.9 listed at zen.spamhaus.org", BLOCKED),  # no enhanced code
        ("554 Your access to this mail system has been rejected due to poor reputation", BLOCKED),
        ("550 5.0.0 Mensagem bloqueada pela política anti-spam", BLOCKED),
        # ...but not those that speak of the address, the relay or our login, nor temporary ones.
        ("550 5.7.13 User account disabled", HARD),
        ("550 5.7.17 Mailbox owner has changed", HARD),
        ("550 5.1.1 <a@b.com>: Recipient address rejected: User unknown", HARD),
        ("554 5.7.1 <a@b.com>: Relay access denied", SENDER),
        ("553 5.7.1 <x@y>: Sender address rejected: not owned by user loja", SENDER),
        ("535 5.7.8 Authentication credentials invalid", SENDER),
        ("451 4.7.1 Service unavailable; client host [203.0.113.9] blocked using Spamhaus", SOFT),
        ("450 Blocked for now, try again later", SOFT),
    ],
)
def test_it_tells_a_policy_block_from_a_bounce(reply: str, kind: Failure) -> None:
    assert classify_reply(None, reply).kind is kind


@pytest.mark.parametrize(
    ("raw", "response", "kind"),
    [
        # SendGrid: a "bounce" event whose type is "blocked"
        ({"event": "bounce", "type": "blocked", "reason": "550 5.7.1 blocked"}, "550 5.7.1 blocked", BLOCKED),
        ({"event": "bounce", "type": "bounce"}, "550 5.1.1 The email account does not exist", HARD),
        # Mailgun: a permanent "failed" event whose reason is "espblock"
        ({"event-data": {"event": "failed", "severity": "permanent", "reason": "espblock"}}, "", BLOCKED),
        ({"event-data": {"event": "failed", "severity": "permanent", "reason": "bounce"}}, "", HARD),
        # Postmark
        ({"Type": "Blocked", "RecordType": "Bounce"}, "", BLOCKED),
        ({"Type": "DMARCPolicy", "RecordType": "Bounce"}, "", BLOCKED),
        ({"Type": "SoftBounce", "RecordType": "Bounce"}, "", SOFT),
        ({"Type": "HardBounce", "RecordType": "Bounce"}, "smtp;550 5.1.1 unknown", HARD),
        # Brevo's "blocked" is its own suppression of the address: not a policy block
        ({"event": "blocked"}, "", HARD),
        ({"event": "soft_bounce"}, "", SOFT),
        # any ESP: the server's own reply decides when the ESP calls a block a bounce
        ({"event": "hard_bounce"}, "550 5.7.1 client host blocked using Spamhaus", BLOCKED),
        ("not a mapping", "", HARD),
    ],
)
def test_esp_events_are_classified_by_the_esps_markers_then_the_servers_reply(
    raw: object, response: str, kind: Failure
) -> None:
    assert classify_esp_bounce(markers=esp_event_markers(raw), response=response) is kind


@pytest.mark.parametrize(
    ("kind", "bounce_type"),
    [(HARD, BounceType.HARD), (SOFT, BounceType.SOFT), (SENDER, None), (BLOCKED, None)],
)
def test_only_bounces_have_a_bounce_type(kind: Failure, bounce_type: BounceType | None) -> None:
    assert SmtpFailure(kind=kind, code=None, enhanced=None, message="").bounce_type is bounce_type


def test_it_parses_a_single_line_reply() -> None:
    assert parse_reply("550 5.1.1 <a@b.com>: Recipient address rejected: User unknown") == (
        550,
        "5.1.1",
        "<a@b.com>: Recipient address rejected: User unknown",
    )


def test_it_parses_a_multi_line_reply_into_one_message() -> None:
    code, enhanced, message = parse_reply(GMAIL_NO_SUCH_USER)

    assert (code, enhanced) == (550, "5.1.1")
    assert message.startswith("The email account that you tried to reach does not exist. Please try double")
    assert "550" not in message
    assert "5.1.1" not in message


def test_it_parses_smtplibs_multi_line_text_which_has_no_codes() -> None:
    # smtplib strips the reply code from every line but leaves the enhanced status in place.
    assert parse_reply("5.2.2 Mailbox full\n5.2.2 Try later") == (None, "5.2.2", "Mailbox full Try later")


def test_it_does_not_read_an_ip_address_as_an_enhanced_status() -> None:
    assert parse_reply("550 host 200.4.1.20 rejected you") == (550, None, "host 200.4.1.20 rejected you")


def test_an_explicit_code_wins_over_one_in_the_text() -> None:
    failure = classify_reply(535, "550 5.1.1 user unknown")

    assert failure == SmtpFailure(kind=SENDER, code=535, enhanced="5.1.1", message="user unknown")


def test_a_recipient_refusal_uses_the_per_recipient_reply() -> None:
    exc = smtplib.SMTPRecipientsRefused({"a@b.com": (550, b"5.1.1 <a@b.com>: User unknown")})

    failure = classify_exception(exc)

    assert failure == SmtpFailure(kind=HARD, code=550, enhanced="5.1.1", message="<a@b.com>: User unknown")
    assert failure.bounce_type is BounceType.HARD


def test_a_recipient_refusal_for_relay_pauses_the_sender_rather_than_bouncing() -> None:
    exc = smtplib.SMTPRecipientsRefused(
        {"x@c.com": (452, b"4.2.2 Mailbox full"), "a@b.com": (554, b"5.7.1 <a@b.com>: Relay access denied")}
    )

    assert classify_exception(exc).kind is SENDER


def test_latin1_bytes_are_decoded_with_replacement_and_still_understood() -> None:
    exc = smtplib.SMTPRecipientsRefused({"a@b.com": (550, "Usuário desconhecido".encode("latin-1"))})

    failure = classify_exception(exc)

    assert failure.kind is HARD
    assert failure.message == "Usu\ufffdrio desconhecido"


@pytest.mark.parametrize(
    ("exc", "kind", "code"),
    [
        (smtplib.SMTPDataError(550, b"5.7.1 Message rejected as spam"), BLOCKED, 550),
        (smtplib.SMTPDataError(552, b"5.2.2 Mailbox full"), SOFT, 552),
        (smtplib.SMTPDataError(451, b"4.3.0 Error: queue file write error"), SOFT, 451),
        (smtplib.SMTPDataError(421, b"4.4.2 Connection timed out"), SENDER, 421),
        (
            smtplib.SMTPSenderRefused(553, b"5.7.1 Sender address rejected: not owned by user", "x@y"),
            SENDER,
            553,
        ),
        (smtplib.SMTPSenderRefused(451, b"4.3.0 Temporary lookup failure", "x@y"), SENDER, 451),
        (smtplib.SMTPAuthenticationError(535, b"5.7.8 Authentication credentials invalid"), SENDER, 535),
        (smtplib.SMTPConnectError(554, b"No SMTP service here"), SENDER, 554),
        (smtplib.SMTPConnectError(-1, b""), SENDER, None),
        (smtplib.SMTPHeloError(501, b"5.5.2 Syntax: HELO hostname"), SENDER, 501),
        (smtplib.SMTPServerDisconnected("Connection unexpectedly closed"), SENDER, None),
        (smtplib.SMTPNotSupportedError("SMTP AUTH extension not supported by server."), SENDER, None),
        (smtplib.SMTPException("No suitable authentication method found."), SENDER, None),
        (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), SENDER, None),
        (ssl.SSLCertVerificationError(1, "certificate verify failed"), SENDER, None),
        (ConnectionRefusedError(111, "Connection refused"), SENDER, None),
        (TimeoutError("timed out"), SENDER, None),  # what socket.timeout is an alias of
        (TimeoutError(), SENDER, None),
        (socket.gaierror(-2, "Name or service not known"), SENDER, None),
        (OSError(101, "Network is unreachable"), SENDER, None),
        (smtplib.SMTPRecipientsRefused({}), SOFT, None),
        (ValueError("something unexpected"), SOFT, None),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_it_classifies_an_exception(exc: BaseException, kind: Failure, code: int | None) -> None:
    failure = classify_exception(exc)

    assert (failure.kind, failure.code) == (kind, code)
    assert failure.message


def test_an_exception_without_text_is_named_in_the_message() -> None:
    assert classify_exception(TimeoutError()).message == "TimeoutError"
    assert classify_exception(ConnectionRefusedError(111, "Connection refused")).message == (
        "ConnectionRefusedError: [Errno 111] Connection refused"
    )


def test_a_sender_refusal_keeps_the_reply_details() -> None:
    exc = smtplib.SMTPSenderRefused(553, b"5.7.1 Sender address rejected: not owned by user", "x@y")

    assert classify_exception(exc) == SmtpFailure(
        kind=SENDER, code=553, enhanced="5.7.1", message="Sender address rejected: not owned by user"
    )
