"""Secrets at rest: AES-256-GCM under the keys of ENCRYPTION_KEY (and ENCRYPTION_OLD_KEYS).

A token is `enc1:<key id>:<base64(nonce | ciphertext | tag)>`. The key id (the first 4 bytes of
the key's SHA-256) says which configured key decrypts it, so a rotation is: put the new key in
ENCRYPTION_KEY and the old one in ENCRYPTION_OLD_KEYS, re-encrypt, then drop the old key.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.apps import apps
from django.conf import settings

PREFIX = "enc1"


class DecryptionError(ValueError):
    """A token that no configured key can open (wrong or missing key, or tampered data)."""


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:8]


def current_key_id() -> str:
    return key_id(settings.ENCRYPTION_KEYS[0])


def encrypt(plaintext: str, *, context: str = "") -> str:
    """Encrypt under the current key. `context` (e.g. "smtp:org-7") binds the token to its place."""
    key = settings.ENCRYPTION_KEYS[0]
    nonce = os.urandom(12)
    sealed = AESGCM(key).encrypt(nonce, plaintext.encode(), context.encode())
    return f"{PREFIX}:{key_id(key)}:{base64.urlsafe_b64encode(nonce + sealed).decode()}"


def decrypt(token: str, *, context: str = "") -> str:
    """The plaintext of a token made by `encrypt` with the same context; raises DecryptionError."""
    try:
        prefix, kid, payload = token.split(":", 2)
        raw = base64.urlsafe_b64decode(payload)
    except ValueError:
        raise DecryptionError("not an encrypted value") from None
    if prefix != PREFIX or len(raw) < 12 + 16:
        raise DecryptionError("not an encrypted value")
    keys = {key_id(k): k for k in settings.ENCRYPTION_KEYS}
    if kid not in keys:
        raise DecryptionError(
            f"encrypted under key {kid}, which is not configured: put that key in ENCRYPTION_OLD_KEYS "
            f"(configured: {', '.join(keys)})"
        )
    try:
        return AESGCM(keys[kid]).decrypt(raw[:12], raw[12:], context.encode()).decode()
    except InvalidTag:
        raise DecryptionError(
            f"value under key {kid} failed authentication (tampered, or wrong context)"
        ) from None


def needs_rotation(token: str) -> bool:
    """True when the token is not under the current key (re-encrypt it)."""
    return token.split(":", 2)[1:2] != [current_key_id()]


# Every encrypted column: (app_label.Model, field name, context). Models register theirs, so
# `manage.py rotate_secrets` can re-encrypt them all under the current key.
ENCRYPTED_FIELDS: list[tuple[str, str, str]] = []


def register_encrypted_field(model_label: str, field: str, context: str) -> None:
    if (model_label, field, context) not in ENCRYPTED_FIELDS:
        ENCRYPTED_FIELDS.append((model_label, field, context))


def rotate(*, batch: int = 500, progress: Callable[[str, int], None] | None = None) -> dict[str, int]:
    """Re-encrypt every registered secret not under the current key; returns {field: rows}.

    Safe while the application runs: each row is rewritten with a compare-and-set on its old
    value, and both keys decrypt until the old one is removed from ENCRYPTION_OLD_KEYS.
    `progress(field, 1)` is told after each row.
    """

    result: dict[str, int] = {}
    current = current_key_id()
    for label, field, context in ENCRYPTED_FIELDS:
        model = apps.get_model(label)
        done = 0
        stale = model._default_manager.exclude(**{f"{field}__startswith": f"{PREFIX}:{current}:"}).exclude(
            **{field: ""}
        )
        for pk, token in stale.values_list("pk", field).iterator(chunk_size=batch):
            fresh = encrypt(decrypt(token, context=context), context=context)
            done += model._default_manager.filter(pk=pk, **{field: token}).update(**{field: fresh})
            if progress:
                progress(f"{label}.{field}", 1)
        result[f"{label}.{field}"] = done
    return result
