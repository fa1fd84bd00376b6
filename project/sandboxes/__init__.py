"""Loopback stand-ins for the providers (Meta's Graph API, SMTP, an ESP, Chatwoot, the Millennium ERP,
an integration's handler), for tests, the demo and benchmarks; the *_sandbox commands start them.
No production module imports them (the `demo` import contract)."""
