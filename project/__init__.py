"""The composition root: the URLconf and the commands that wire the apps together (`demo`, `up`),
the demo organization's data (`demo/`) and the providers' loopback sandboxes (`sandboxes/`, and
the `*_sandbox` commands that start them).

The only package that may import every app; nothing imports it (the layers contract in
pyproject.toml checks both).
"""
