"""The composition root: the URLconf and the commands that wire the apps together (`demo`, `up`).

The only package that may import every app; nothing imports it (the layers contract in
pyproject.toml checks both).
"""
