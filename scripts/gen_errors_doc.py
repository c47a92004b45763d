#!/usr/bin/env python3
"""Write docs/errors.md from the error classes: every code, its exit code and errno.

Scripts match codes, never text, so the list of codes is a contract; this script makes
the page from the classes themselves, and tests/unit/test_errors_doc.py fails when the
page and the classes disagree.  It reads:

- every subclass of ``RewindfsError`` (``store/_errors.py``) defined in a ``rewindfs``
  module: its ``code``, ``exit_code`` (the CLI's), ``errno`` (the FUSE boundary's) and
  the first line of its docstring (the message template).  Every module of
  ``rewindfs.store``, ``rewindfs.overlay`` and ``rewindfs.plugin`` is imported first
  (``pkgutil.walk_packages``), so a class is found wherever it lives;
- every subclass of the Python client's ``RewindfsClientError`` (``plugin/_errors.py``)
  and each ``code="..."`` given where the client raises one directly;
- the dsh plugin's table, ``CODES`` in ``plugin/dsh/lib/errors.js`` (a strict-JSON
  literal, read from the file; node is not needed).

``problems()`` names what would make the page wrong: a class without a code of its
own, two classes sharing a code with different exit codes or errnos, a class without a
meaning, a code the client raises that no class defines.

Usage: ``.venv/bin/python scripts/gen_errors_doc.py`` writes the page (the rooms must be
importable as ``rewindfs.*``); ``--check`` only compares (exit 1 when it is stale).
"""

from __future__ import annotations

import argparse
import ast
import errno
import importlib
import inspect
import json
import pkgutil
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "errors.md"
JS_TABLE = ROOT / "plugin" / "dsh" / "lib" / "errors.js"
JS_OPENER = "export const CODES = Object.freeze("
PACKAGES = ("rewindfs.store", "rewindfs.overlay", "rewindfs.plugin")
KEBAB = re.compile(r"[a-z]+(-[a-z]+)*")


def import_all() -> list[str]:
    """Import every module of the three rooms (``__main__`` modules excepted: importing
    one would run it) and return their names."""
    names = []
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(pkg.__path__, package + "."):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue
            importlib.import_module(info.name)
            names.append(info.name)
    return names


def subclasses(root: type) -> list[type]:
    """``root`` and every class below it, defined in a ``rewindfs`` module (a test's
    own subclass is not part of the contract), ordered by module and name."""
    seen, todo = {root}, [root]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return sorted((c for c in seen if c.__module__.split(".")[0] == "rewindfs"),
                  key=lambda c: (c.__module__, c.__qualname__))


def meaning(cls: type) -> str:
    """One line from the class's own docstring: its first line (the message template),
    or, when that is only ``{message}``, the paragraph after it.  Empty when there is
    none (a problem: see ``problems()``)."""
    paragraphs = [" ".join(p.split())
                  for p in inspect.cleandoc(cls.__dict__.get("__doc__") or "").split("\n\n")]
    if not paragraphs[0]:
        return ""
    if paragraphs[0] == "{message}":
        return paragraphs[1] if len(paragraphs) > 1 else ""
    return inspect.cleandoc(cls.__doc__).splitlines()[0].strip()


def exit_codes() -> dict[int, str]:
    """The CLI's exit codes, named by the constants in ``store/_errors.py``
    (``EXIT_COULD_NOT_RUN = 2`` reads "could not run")."""
    from rewindfs.store import _errors
    return {value: name.removeprefix("EXIT_").lower().replace("_", " ")
            for name, value in vars(_errors).items()
            if name.startswith("EXIT_") and isinstance(value, int)}


def room_of_module(name: str) -> str:
    """``store``, ``overlay`` or ``plugin``: stable when a module moves inside its room."""
    return name.split(".")[1]


def room(cls: type) -> str:
    return room_of_module(cls.__module__)


@dataclass(frozen=True)
class Row:
    code: str
    name: str            # room.Class
    meaning: str
    exit_code: int | None = None
    errno_name: str | None = None
    protocol: bool = False


def daemon_rows(classes, protocol_root=None) -> list[Row]:
    rows = []
    for cls in classes:
        rows.append(Row(cls.code, f"{room(cls)}.{cls.__name__}", meaning(cls), cls.exit_code,
                        errno.errorcode.get(cls.errno, str(cls.errno)),
                        protocol_root is not None and issubclass(cls, protocol_root)))
    return sorted(rows, key=lambda r: (r.code, r.name))


def literal_codes(modules) -> list[tuple[str, str]]:
    """``(code, module)`` for each code written as a literal outside a class body in the
    given modules' source: ``code="..."`` (a keyword), ``x.code = "..."``, ``{"code":
    "..."}``.  Each must be a class's code: a code made up at a raise would be missing
    from the page."""
    found = []
    for module in modules:
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            values = []
            if isinstance(node, ast.Call):
                values = [kw.value for kw in node.keywords if kw.arg == "code"]
            elif isinstance(node, ast.Assign):
                values = [node.value for t in node.targets
                          if isinstance(t, ast.Attribute) and t.attr == "code"]
            elif isinstance(node, ast.Dict):
                values = [v for k, v in zip(node.keys, node.values)
                          if isinstance(k, ast.Constant) and k.value == "code"]
            found += [(v.value, module.__name__) for v in values
                      if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return sorted(set(found))


def js_codes(path: Path = JS_TABLE) -> dict[str, str]:
    """The dsh plugin's ``CODES`` table, parsed from its strict-JSON literal."""
    text = path.read_text()
    start = text.find(JS_OPENER)
    if start < 0:
        raise ValueError(f"{path}: no `{JS_OPENER}` (the table moved?)")
    table, _end = json.JSONDecoder().raw_decode(text, text.index("{", start))
    return table


@dataclass
class Catalogue:
    daemon_root: type     # RewindfsError
    daemon: list          # it and its subclasses
    protocol_root: type | None   # the protocol's own errors' base (code protocol-error)
    client_root: type     # RewindfsClientError
    client: list          # it and its subclasses
    literals: list        # (code, module): codes written at a raise (literal_codes)
    js: dict              # code -> meaning


def collect() -> Catalogue:
    modules = import_all()
    from rewindfs.plugin._errors import RewindfsClientError
    from rewindfs.store._errors import RewindfsError
    daemon = subclasses(RewindfsError)
    protocol = [c for c in daemon if c.__dict__.get("code") == "protocol-error"]
    return Catalogue(RewindfsError, daemon, protocol[0] if protocol else None,
                     RewindfsClientError, subclasses(RewindfsClientError),
                     literal_codes([sys.modules[m] for m in modules]), js_codes())


def problems(cat: Catalogue) -> list[str]:
    """What would make the page wrong or a script's match ambiguous; empty if none."""
    out = []
    by_code: dict[str, type] = {}
    for cls in cat.daemon:
        if cls is not cat.daemon_root and "code" not in cls.__dict__:
            out.append(f"{cls.__module__}.{cls.__qualname__} has no code of its own "
                       f"(it would answer {cls.code!r}, its parent's)")
            continue
        if not KEBAB.fullmatch(cls.code):
            out.append(f"{cls.__qualname__}: code {cls.code!r} is not kebab-case")
        if not meaning(cls):
            out.append(f"{cls.__qualname__} ({cls.code}) has no docstring to say what it means")
        other = by_code.setdefault(cls.code, cls)
        if other is not cls and (other.exit_code, other.errno) != (cls.exit_code, cls.errno):
            out.append(f"{other.__qualname__} and {cls.__qualname__} share code {cls.code!r} "
                       f"with exit codes {other.exit_code}/{cls.exit_code}, errnos "
                       f"{other.errno}/{cls.errno}")
    client_codes = set()
    for cls in cat.client:
        if cls is not cat.client_root and "default_code" not in cls.__dict__:
            out.append(f"{cls.__module__}.{cls.__qualname__} has no default_code of its own")
            continue
        client_codes.add(cls.default_code)
        if not KEBAB.fullmatch(cls.default_code):
            out.append(f"{cls.__qualname__}: code {cls.default_code!r} is not kebab-case")
        if not meaning(cls):
            out.append(f"{cls.__qualname__} ({cls.default_code}) has no docstring")
    for code, module in cat.literals:
        if code not in by_code and code not in client_codes:
            out.append(f"{module} writes code {code!r}, which no class defines")
    for code, text in cat.js.items():
        if not KEBAB.fullmatch(code) or not isinstance(text, str) or not text:
            out.append(f"plugin/dsh/lib/errors.js: bad entry {code!r}: {text!r}")
    return out


def _cell(text) -> str:
    return "—" if text is None or text == "" else str(text).replace("|", "\\|")


HEAD = """\
# Error codes

<!-- GENERATED by scripts/gen_errors_doc.py from the error classes; do not edit.
     tests/unit/test_errors_doc.py fails when this page and the classes disagree. -->

Scripts match the **code**, never the message.  A code is the same on every edge:
`rewindfs --json` prints it (`{"type": "error", "code": …, "exit_code": …}`), the
control socket sends it (`{"ok": false, "error": {"code": …, "message": …}}`), the
Python client raises it as `RewindfsClientError.code`, the dsh plugin as
`refusal.code`.  The CLI turns an error into its exit code only in `main()`; a FUSE
handler turns it into its errno only at the FUSE boundary.

## Exit codes

| exit | meaning |
|---|---|
"""

DAEMON_HEAD = """
(In detail: [README, Exit codes](../README.md#exit-codes).)

An exception rewindfs did not expect exits 2 with one line naming it (code
`internal`; `-v` prints the traceback), never 1.

## rewindfs errors (store, daemon, CLI)

Every `RewindfsError` subclass.  *exit*: the CLI's exit code; *errno*: what a file
operation gets when this error stops it; *protocol*: raised by the control protocol
itself (framing, version, method, parameters, peer).  The meaning is the message
template; `{…}` is filled in at raise time.

| code | class | exit | errno | protocol | meaning |
|---|---|---|---|---|---|
"""

CLIENT_HEAD = """
## Python client (`rewindfs.plugin`)

`RewindfsClientError.code` is the daemon's code (above) or one made by the client
itself:

| code | class | meaning |
|---|---|---|
"""

JS_HEAD = """
## dsh plugin (`plugin/dsh/lib/errors.js`)

`RewindfsCallError.code` and `refusal.code`: the daemon's code, passed on unchanged,
or one of these, made by the plugin:

| code | meaning |
|---|---|
"""


def render(cat: Catalogue) -> str:
    out = [HEAD]
    out += [f"| {code} | {text} |\n" for code, text in sorted(exit_codes().items())]
    out.append(DAEMON_HEAD)
    out += [f"| `{r.code}` | `{r.name}` | {r.exit_code} | `{r.errno_name}` | "
            f"{'yes' if r.protocol else ''} | {_cell(r.meaning)} |\n"
            for r in daemon_rows(cat.daemon, cat.protocol_root)]
    out.append(CLIENT_HEAD)
    out += [f"| `{c.default_code}` | `{room(c)}.{c.__name__}` | {_cell(meaning(c))} |\n"
            for c in sorted(cat.client, key=lambda c: (c.default_code, c.__name__))]
    own = [(code, module) for code, module in cat.literals
           if room_of_module(module) == "plugin"]
    if own:
        out.append("\nThe client also raises these daemon codes itself, before sending:\n\n")
        out += [f"- `{code}` (`{module.removeprefix('rewindfs.')}`)\n" for code, module in own]
    out.append(JS_HEAD)
    out += [f"| `{code}` | {_cell(text)} |\n" for code, text in sorted(cat.js.items())]
    return "".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with docs/errors.md instead of writing it")
    args = parser.parse_args(argv)
    cat = collect()
    found = problems(cat)
    for p in found:
        print(f"gen_errors_doc: {p}", file=sys.stderr)
    text = render(cat)
    if args.check:
        stale = not DOC.is_file() or DOC.read_text() != text
        if stale:
            print("gen_errors_doc: docs/errors.md is stale; run scripts/gen_errors_doc.py",
                  file=sys.stderr)
        return 1 if stale or found else 0
    DOC.write_text(text)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
