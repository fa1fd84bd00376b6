from __future__ import annotations

import base64

import pytest

from crm import crypto


def _key(n: int) -> bytes:
    return bytes([n]) * 32


def test_a_secret_round_trips_and_is_not_readable_at_rest(settings):
    settings.ENCRYPTION_KEYS = [_key(1)]
    token = crypto.encrypt("s3nha-smtp", context="smtp:org-1")
    assert "s3nha" not in token and token.startswith("enc1:")
    assert crypto.decrypt(token, context="smtp:org-1") == "s3nha-smtp"
    assert crypto.encrypt("s3nha-smtp", context="smtp:org-1") != token  # a fresh nonce every time


def test_a_token_moved_to_another_place_or_tampered_with_is_refused(settings):
    settings.ENCRYPTION_KEYS = [_key(1)]
    token = crypto.encrypt("secret", context="smtp:org-1")
    with pytest.raises(crypto.DecryptionError, match="failed authentication"):
        crypto.decrypt(token, context="smtp:org-2")
    prefix, kid, payload = token.split(":", 2)
    raw = bytearray(base64.urlsafe_b64decode(payload))
    raw[-1] ^= 1
    with pytest.raises(crypto.DecryptionError):
        crypto.decrypt(
            f"{prefix}:{kid}:{base64.urlsafe_b64encode(bytes(raw)).decode()}", context="smtp:org-1"
        )
    with pytest.raises(crypto.DecryptionError, match="not an encrypted value"):
        crypto.decrypt("plain text")


def test_rotation_keeps_old_tokens_readable_and_says_which_need_re_encrypting(settings):
    settings.ENCRYPTION_KEYS = [_key(1)]
    old = crypto.encrypt("secret")
    settings.ENCRYPTION_KEYS = [_key(2), _key(1)]  # new ENCRYPTION_KEY, old one in ENCRYPTION_OLD_KEYS
    assert crypto.decrypt(old) == "secret"
    assert crypto.needs_rotation(old)
    assert not crypto.needs_rotation(crypto.encrypt("secret"))
    settings.ENCRYPTION_KEYS = [_key(2)]  # old key dropped too early
    with pytest.raises(crypto.DecryptionError, match="ENCRYPTION_OLD_KEYS"):
        crypto.decrypt(old)


def test_rotate_secrets_re_encrypts_stored_tokens_under_the_new_key(db, settings, english):
    from io import StringIO

    from django.core.management import call_command

    from crm.models import Organization
    from integrations.models import WhatsappNumber

    settings.ENCRYPTION_KEYS = [_key(1)]
    org = Organization.objects.create(name="Loja", slug="loja")
    number = WhatsappNumber(organization=org, display_phone_number="+5511940000000", phone_number_id="123")
    number.set_access_token("EAAG-secret")
    number.save()
    settings.ENCRYPTION_KEYS = [_key(2), _key(1)]  # new key deployed, old one still accepted
    out = StringIO()
    call_command("rotate_secrets", stdout=out)
    assert "integrations.WhatsappNumber.access_token_encrypted: 1 re-encrypted" in out.getvalue()
    call_command("rotate_secrets", stdout=StringIO())  # nothing left to do, nothing broken
    settings.ENCRYPTION_KEYS = [_key(2)]  # old key dropped
    number.refresh_from_db()
    assert number.get_access_token() == "EAAG-secret"
    assert number.access_token_encrypted.startswith(f"enc1:{crypto.key_id(_key(2))}:")
