"""Models of this app arrive with their issue; see docs/architecture.md."""
