"""Structural checks of the product code that ruff and lint-imports do not make (scripts/lint structure):

- no module is longer than MAX_MODULE_LINES: a longer one holds more than one concern, split it
  into modules or a package a newcomer can name;
- no function is longer than MAX_FUNCTION_LINES, from its `def` line to its last (docstring
  included): split a longer one into named steps;
- no module uses a private name (a leading underscore) of another app: `from campaigns.whatsapp.sending
  import _release` inside surveys, or `sending._release` after `from campaigns.whatsapp import
  sending`. What two apps share is made public by the app that owns it;
- no module but the outbound seams opens a connection itself (`httpx.Client(`, `requests.post(`,
  `aiohttp.ClientSession(`, `smtplib.SMTP(`, `socket.create_connection(`, `loop.create_connection(`
  …): every connection to an address someone configured goes through integrations.http (its
  http_pool) / integrations.email.smtp, which connect through integrations.outbound's guard.
  Sandboxes (loopback fakes) are exempt.

The product code is the packages below; tests/, migrations and benchmarks/ are not checked. Prints
each problem as file:line and exits 1 when there is one."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("crm", "messaging", "campaigns", "runner", "surveys", "erp", "flows", "integrations", "project")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600  # a longer module holds more than one concern: split it into rooms

# Files whose functions may exceed MAX_FUNCTION_LINES while they are being split (none today).
LONG_FUNCTIONS_ALLOWED: set[str] = set()


def product_files() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.relative_to(ROOT).parts:
                yield path


def long_functions(where: str, tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                yield (
                    f"{where}:{node.lineno}: {node.name} is {length} lines long "
                    f"(at most {MAX_FUNCTION_LINES}): split it into named steps"
                )


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_module(dotted: str) -> bool:
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def foreign_imports(app: str, tree: ast.Module) -> Iterator[tuple[int, str, str, str]]:
    """(line, local name, the name imported, what the local name is bound to) of each import
    from another app: `import a.b` imports a.b and binds `a`; every other form binds the name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                (a.asname or a.name, f"{node.module}.{a.name}", f"{node.module}.{a.name}") for a in node.names
            ]
        elif isinstance(node, ast.Import):
            names = [
                (a.asname, a.name, a.name)
                if a.asname
                else (a.name.split(".")[0], a.name, a.name.split(".")[0])
                for a in node.names
            ]
        else:
            continue
        for local, imported, bound in names:
            owner = imported.split(".")[0]
            if owner != app and owner in PACKAGES:
                yield node.lineno, local, imported, bound


def dotted_module(node: ast.expr, modules: dict[str, str]) -> str | None:
    """The dotted name `node` spells from a name bound to another app's module, or None."""
    if isinstance(node, ast.Name):
        return modules.get(node.id)
    if isinstance(node, ast.Attribute):
        parent = dotted_module(node.value, modules)
        return f"{parent}.{node.attr}" if parent else None
    return None


def foreign_private_names(where: str, app: str, tree: ast.Module) -> Iterator[str]:
    """Private names of another app this module imports, or reads off another app's module."""
    modules: dict[str, str] = {}  # local name -> the other app's module (or package) it is bound to
    for line, local, imported, bound in foreign_imports(app, tree):
        if any(private(part) for part in imported.split(".")):
            yield f"{where}:{line}: imports {imported}, private to {imported.split('.')[0]}"
        elif is_module(bound):
            modules[local] = bound
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            module = dotted_module(node.value, modules)
            if module and is_module(module):
                yield f"{where}:{node.lineno}: uses {module}.{node.attr}, private to {module.split('.')[0]}"


# module -> names whose call (or import) opens an outbound connection.
CONNECTING = {
    "httpx": {
        "Client",
        "AsyncClient",
        "HTTPTransport",
        "get",
        "post",
        "put",
        "patch",
        "delete",
        "request",
        "stream",
    },
    "requests": {"Session", "session", "get", "post", "put", "patch", "delete", "request", "head"},
    "aiohttp": {"ClientSession", "TCPConnector", "request"},
    "smtplib": {"SMTP", "SMTP_SSL", "LMTP"},
    "socket": {"create_connection"},
    "urllib.request": {"urlopen"},
    "asyncio": {"open_connection"},
}
# An event loop's own connections (`loop.create_connection(`, `asyncio.get_running_loop().…`).
LOOP_CONNECTING = {"create_connection", "open_connection", "create_datagram_endpoint"}
# The seams themselves, the guard, and the broker client of the deployment's own AMQP_URL.
OUTBOUND_SEAMS = {
    "integrations/http.py",
    "integrations/http_pool.py",
    "integrations/email/smtp.py",
    "integrations/outbound.py",
    "integrations/runner/amqp.py",
}


def connecting_calls(where: str, tree: ast.Module) -> Iterator[str]:
    """Connections opened outside the outbound seams."""
    if where in OUTBOUND_SEAMS or "sandbox" in where:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in CONNECTING:
            for alias in node.names:
                if alias.name in CONNECTING[node.module]:
                    yield f"{where}:{node.lineno}: imports {node.module}.{alias.name}: use integrations.http"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            loop_call = node.func.attr in LOOP_CONNECTING and "loop" in owner
            if node.func.attr in CONNECTING.get(owner, ()) or loop_call:
                yield (
                    f"{where}:{node.lineno}: {owner}.{node.func.attr}() connects outside the outbound "
                    "seams: use integrations.http (or integrations.email.smtp)"
                )


def main() -> int:
    problems: list[str] = []
    for path in product_files():
        where = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), filename=where)
        if where not in LONG_FUNCTIONS_ALLOWED:
            problems.extend(long_functions(where, tree))
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES:
            problems.append(f"{where}: {lines} lines, more than {MAX_MODULE_LINES}: split it by concern")
        problems.extend(foreign_private_names(where, where.split("/")[0], tree))
        problems.extend(connecting_calls(where, tree))
    for problem in problems:
        print(problem)
    if not problems:
        print(
            f"no module over {MAX_MODULE_LINES} lines, no function over {MAX_FUNCTION_LINES}, no private "
            "name of another app used, no connection outside the outbound seams"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
