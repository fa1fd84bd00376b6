"""A customer's media (image, audio, video, document, sticker) fetched from Meta on demand, through
the outbound guard: `GET /{version}/{media-id}` gives a short-lived URL, fetched with the same token.
Nothing is downloaded automatically; the bytes are never stored here."""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

from integrations import http
from integrations.errors import IntegrationError
from integrations.outbound import OutboundURLError

MAX_MEDIA_BYTES = 100 * 1024 * 1024  # Meta's largest (a document)
# Meta's media ids are digits; letters, '_' and '-' are let through (the sandbox's). Anything else
# ('..', '?', '#', '%', '\\', '@') would make the Graph URL name another path with our token.
MEDIA_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


@dataclass(frozen=True)
class Media:
    content: bytes
    mime_type: str


def media_fetch(*, base_url: str, version: str, media_id: str, access_token: str) -> Media:
    """The media's bytes and type; IntegrationError (retryable or not) when Meta or the URL refuse."""
    if not MEDIA_ID.fullmatch(media_id):
        raise IntegrationError(f"not a media id: {media_id[:140]!r}", retryable=False)
    auth = {"Authorization": f"Bearer {access_token}"}
    with http.client(headers=auth, max_response_bytes=MAX_MEDIA_BYTES) as client:
        what = f"Meta GET media {media_id}"
        try:
            meta = client.get(f"{base_url.rstrip('/')}/{version}/{media_id}")
            if meta.status_code >= 400:
                raise http.status_error(what, meta, details=meta.text[:300])
            url = meta.json().get("url") if isinstance(meta.json(), dict) else None
            if not isinstance(url, str) or not url.startswith(("https://", "http://")):
                raise IntegrationError(f"{what}: no media URL in the answer", retryable=False)
            response = client.get(url)
        except httpx.TransportError as exc:
            raise http.no_answer_error(what, exc, idempotent=True) from exc
        except OutboundURLError as exc:  # the media URL names a forbidden address (SSRF guard)
            raise IntegrationError(f"{what}: {exc}", retryable=False) from exc
        except ValueError as exc:
            raise IntegrationError(f"{what}: an answer that is not JSON", retryable=False) from exc
        if response.status_code >= 400:
            raise http.status_error(what, response, details=response.text[:300])
        return Media(response.content, response.headers.get("Content-Type", "application/octet-stream"))
