"""The external systems. Provider packages (`whatsapp/`, `email/`, `chatwoot/`, `millennium/`,
`runner/`) take plain values and return plain values, every connection through `http.py` and the
`outbound.py` guard; they import no model and not each other (their loopback sandboxes live in
`project/sandboxes/`). The integrations app itself (`models`, `services`, `clients`, `admin`) keeps
each organization's provider settings, credentials encrypted at rest.

Anything above the platform may import the app; anything may import a provider package.
"""
