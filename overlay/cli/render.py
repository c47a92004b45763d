"""Rendering for the restore commands: the history table, rewind progress, diffs.

People get rich tables and a progress bar on a terminal; ``--json`` gets one JSON Lines
record per event (``{"v":1,"type":"rewind.written",…}``) and nothing else on stdout.
"""

from __future__ import annotations

import datetime
import difflib
import os
import re
import stat

from rich.markup import escape as _markup_escape
from rich.table import Table

from rewindfs.overlay.errors import BadAmount

__all__ = ["INTENT_FINISHING", "INTENT_PENDING", "RewindView", "parse_duration", "parse_size", "render_diff", "render_gc", "render_log"]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\udc80-\udcff]")


def _visible(match) -> str:
    ch = match.group()
    code = ord(ch) - 0xDC00 if 0xDC80 <= ord(ch) <= 0xDCFF else ord(ch)
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, f"\\x{code:02x}")


def escape(text: str, *, keep_tabs: bool = False, markup: bool = True) -> str:
    """Text from the workspace or the user (names, labels, session names, messages that
    embed them) for a terminal: control characters (a file named with ``ESC[…`` must
    not drive the terminal, a newline must not forge a line) and undecodable bytes shown
    as ``\\n``/``\\xNN``; rich markup escaped unless ``markup=False`` (text written
    without rich).  The one escape of every human output path."""
    if keep_tabs:
        return "\t".join(escape(t, markup=markup) for t in text.split("\t"))
    shown = _CONTROL.sub(_visible, text)
    return _markup_escape(shown) if markup else shown


def truncate(text: str, width: int) -> str:
    """*text* in at most *width* terminal cells (wide characters count two), cut with
    ``…`` when it does not fit.  Escape first (``escape``): a cut never splits ``\\x1b``
    into something a terminal would act on, because escaped text has no control
    characters left."""
    from rich.cells import cell_len, set_cell_size
    if cell_len(text) <= width:
        return text
    if width <= 0:
        return ""
    return set_cell_size(text, width - 1).rstrip(" ") + "…"


def when(ns) -> str:
    if not ns:
        return ""
    # Month-day and minute tell a person's turns apart and leave the label room in 80
    # columns (the epoch column orders them; --json keeps the nanoseconds).
    return datetime.datetime.fromtimestamp(ns / 1e9).strftime("%m-%d %H:%M")


# What an interrupted rewind's intent means to the user, said the same by every command.
INTENT_PENDING = ("an interrupted rewind is pending (the tree may be half rewound); "
                  "the next `mount`, `rewind` or `redo` finishes it")
INTENT_FINISHING = "finishing an interrupted rewind first"


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def parse_duration(text: str) -> float:
    from rewindfs.store._gc import MAX_SECONDS      # gc's limits, with the store (gc needs it)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not m:
        raise BadAmount(value=text, what="a duration (e.g. 90s, 12h, 30d)")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
    seconds = float(m.group(1)) * scale
    if not seconds <= MAX_SECONDS:   # also inf: 400 digits overflow the float
        raise BadAmount(value=text, what=f"a duration of at most {MAX_SECONDS} s")
    return seconds


def parse_size(text: str) -> int:
    from rewindfs.store._gc import MAX_COUNT
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise BadAmount(value=text, what="a size (e.g. 500M, 2G)")
    size = float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " ")
    if not size <= MAX_COUNT:        # also inf, which int() cannot take
        raise BadAmount(value=text, what=f"a size of at most {MAX_COUNT} bytes")
    return int(size)


# -- log --------------------------------------------------------------------------------

_LOG_COLUMNS = ("epoch", "kind", "session", "turn", "label", "time", "files", "bytes")
_RIGHT = ("epoch", "turn", "files", "bytes")


def render_log(out, points: list[dict], *, mounted: bool) -> None:
    """The history, one line per epoch, as wide as the terminal: every column stays;
    the session and the label give way (cut with ``…``).  ``--json`` keeps them whole."""
    if out.json:
        for p in points:
            out.emit("epoch", **p)
        return
    rows = []
    for p in points:
        label = p.get("label") or ""
        if p["kind"] == "rewind" and p.get("target") is not None:
            label = f"→ point e{p['target']}" + (f" {label}" if label else "")
        elif p["kind"] == "redo" and p.get("target") is not None:
            label = f"undid e{p['target']}" + (f" {label}" if label else "")
        style = {"turn": "", "idle": "dim", "rewind": "magenta", "redo": "magenta"}.get(
            p["kind"], "")
        rows.append(([f"e{p['epoch']}", p["kind"], escape(p.get("session") or "", markup=False),
                      str(p["turn"]) if p.get("turn") is not None else "",
                      escape(label, markup=False), when(p.get("started_ns")),
                      str(p.get("paths", 0)), human_bytes(p.get("bytes", 0))], style))
    widths = _log_widths([r for r, _ in rows], out.console.width)
    # soft_wrap: the lines are laid out to fit already, and rich's wrapping of 10,000
    # of them took a second
    out.console.print(_log_table(rows, widths, out.console.width), soft_wrap=True)
    if not points:
        out.say("no history yet")


def _log_table(rows: list[tuple[list[str], str]], widths: list[int], total: int):
    """The log's table as one styled ``Text``: rich's ``Table`` measured and rendered
    every cell as a renderable, 0.7 ms a row — 7 s for a 10,000-epoch history — where
    this lays the same lines out directly (the same frame: ``┃`` header, ``╇`` rule,
    ``│`` rows; long cells cut with ``…``; wide characters counted by their cells;
    a line wider than *total* cells, in a terminal too narrow for every column, cut)."""
    from rich.text import Text
    right = [col in _RIGHT for col in _LOG_COLUMNS]

    def line(cells, sep):
        text = f" {sep} ".join(_fit(c, w, r) for c, w, r in zip(cells, widths, right))
        return _fit(text, total, False).rstrip() if _cells(text) > total else text

    text = Text()
    text.append(line(_LOG_COLUMNS, "┃") + "\n", style="bold")
    text.append(line(["━" * w for w in widths], "╇").replace(" ╇ ", "━╇━") + "\n")
    for cells, style in rows:
        text.append(line(cells, "│") + "\n", style=style)
    text.rstrip()
    return text


def _cells(text: str) -> int:
    """Terminal cells of *text* (``len`` for ASCII, the common case, 10× cheaper)."""
    if text.isascii():
        return len(text)
    from rich.cells import cell_len
    return cell_len(text)


def _fit(cell: str, width: int, right: bool) -> str:
    """*cell* in exactly *width* terminal cells: cut with ``…``, else padded."""
    from rich.cells import set_cell_size
    size = _cells(cell)
    if size > width:
        return set_cell_size(cell, max(width - 1, 0)) + "…" if width else ""
    pad = " " * (width - size)
    return pad + cell if right else cell + pad


def _log_widths(rows: list[list[str]], total: int) -> list[int]:
    """Each column's width, measured once: what its widest cell needs, except the two
    columns that give way (session, label) so the table fits *total* cells — what the
    other columns need is theirs, a third of the rest goes to the session (at least its
    header), the label takes what is left.  A terminal too narrow even for that gets
    lines cut at its edge (``_log_table``)."""
    need = [max([_cells(col)] + [_cells(r[i]) for r in rows])
            for i, col in enumerate(_LOG_COLUMNS)]
    # each column: a space either side, inner ones also a rule (no outer edge or pad)
    frame = 3 * len(_LOG_COLUMNS) - 3
    fixed = sum(w for col, w in zip(_LOG_COLUMNS, need) if col not in ("session", "label"))
    room = total - frame - fixed
    session_need, label_need = need[2], need[4]
    if session_need + label_need > room:
        session = min(session_need, max(len("session"), room // 3))
        need[2], need[4] = session, min(label_need, max(len("label"), room - session))
    return need


# -- rewind / redo -------------------------------------------------------------------------

def _changed(counts: dict) -> int:
    """Paths a plan or result changes (everything but unchanged/ignored)."""
    return sum(counts.get(k, 0) for k in ("written", "created", "deleted", "meta"))


class RewindView:
    """Consumes rewind events: JSON Lines, or a summary + progress bar for people."""

    def __init__(self, out, *, dry_run: bool):
        self.out, self.dry_run = out, dry_run
        self.progress = self.task = None
        self.planned: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.stop()

    def event(self, ev: dict) -> None:
        if self.out.json:
            self.out.emit(ev.get("type", "event"), **{k: v for k, v in ev.items()
                                                         if k != "type"})
            return
        kind = ev.get("type")
        if kind == "rewind.planned":
            self._planned(ev)
        elif kind in ("rewind.written", "rewind.deleted") and self.progress is not None:
            self.progress.advance(self.task)
        elif kind == "rewind.failed":
            self.out.console.print(f"[red]failed[/] {escape(ev['path'])}: "
                                   f"{escape(ev['message'])} [dim]({ev['code']})[/]")

    def _planned(self, ev: dict) -> None:
        self.planned = ev
        total = _changed(ev)
        self.out.say(f"{'plan: ' if self.dry_run else ''}{_going(ev, done=False)}: "
                     f"{ev.get('written', 0)} written, "
                     f"{ev.get('created', 0)} created, {ev.get('deleted', 0)} deleted, "
                     f"{ev.get('meta', 0)} metadata-only")
        if not self.dry_run:   # named before the first change lands
            self._foreign(ev.get("foreign") or [])
        if not self.dry_run and total and self.out.console.is_terminal:
            from rich.progress import Progress
            self.progress = Progress(console=self.out.console, transient=True)
            self.progress.start()
            self.task = self.progress.add_task("restoring", total=total)

    def _foreign(self, foreign: list[dict]) -> None:
        if not foreign:
            return
        self.out.say(f"[yellow]{len(foreign)} path(s) were changed since the point outside "
                     f"this session's turns[/] (a person between turns, or another session):")
        for f in foreign:
            who = "idle (between turns)" if f["kind"] == "idle" else (
                f"session {escape(f['session'] or '')} turn {f['turn']}")
            self.out.say(f"  {escape(f['path'])}  [dim]{who}, e{f['epoch']}[/]")

    def finish(self, result: dict) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if self.out.json:
            return
        self._unrecorded(result.get("unrecorded") or [])
        if self.dry_run:
            # nothing known at all beyond the unrecorded paths: they were the answer
            quiet = bool(result.get("unrecorded")) and not any(
                result.get(k) for k in ("unchanged", "ignored"))
            self._plan_table(result.get("changes", []), quiet=quiet)
        if self.dry_run or not self.planned:
            self._foreign(result.get("foreign") or [])
        if not self.dry_run:
            failed = result.get("failed") or []
            done = _changed(result)
            kind = "redo" if result.get("undid") is not None else "rewind"
            line = (f"{_going(result, done=True)}: restored {done} path(s) as {kind} "
                    f"epoch e{result.get('epoch')}")
            self.out.say(line + (f"; [red]{len(failed)} failed[/] (exit 1)" if failed else ""))

    def _unrecorded(self, paths: list[str]) -> None:
        """``--path`` values no epoch since the point knows: named, not "nothing"."""
        for p in paths:
            self.out.say(f"{escape(p)}: not recorded at that point")

    def _plan_table(self, changes: list[dict], *, quiet: bool = False) -> None:
        if not changes:
            if not quiet:   # the unrecorded paths were named instead
                self.out.say("nothing to change")
            return
        table = Table(show_edge=False, header_style="bold")
        table.add_column("change")
        table.add_column("path", overflow="fold")
        colour = {"created": "green", "deleted": "red", "written": "yellow", "meta": "cyan"}
        for c in changes:
            name = "metadata" if c["change"] == "meta" else c["change"]
            table.add_row(f"[{colour.get(c['change'], '')}]{name}[/]", escape(c["path"]))
        self.out.console.print(table)


def _going(ev: dict, *, done: bool) -> str:
    """Where a rewind or redo goes, as a person reads it: "rewound to the start of turn 2
    of s1 — make it per-tenant — e4"; a redo: "undid rewind e9: back to …"."""
    target = ev.get("target_point") or {"epoch": ev.get("target"), "kind": None}
    where = _point_phrase(target)
    if ev.get("undid") is not None:
        return f"{'undid' if done else 'undoing'} rewind [bold]e{ev['undid']}[/]: back to {where}"
    return f"{'rewound' if done else 'rewinding'} to {where}"


def _point_phrase(p: dict) -> str:
    eid = f"[bold]e{p['epoch']}[/]"
    if p.get("kind") == "turn":
        label = escape(_first_line(p.get("label") or ""), markup=True)
        return (f"the start of turn {p['turn']} of {escape(p.get('session') or '', markup=True)}"
                + (f" — {label}" if label else "") + f" — {eid}")
    if p.get("kind") == "idle":
        return f"the start of {eid} (edits between turns)"
    if p.get("kind") in ("rewind", "redo"):
        return f"the state {p['kind']} {eid} found"
    return f"point {eid}"


def _first_line(text: str, limit: int = 60) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[:limit - 1] + "…"


# -- diff ---------------------------------------------------------------------------------

def _is_text(data: bytes | None) -> bool:
    if data is None:
        return True
    if b"\0" in data[:8192]:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _diff_lines(change: dict, a_name: str, b_name: str, a: bytes | None, b: bytes | None):
    path = _CONTROL.sub(_visible, change["path"])   # a newline in a name forges no header
    if change["a_kind"] not in ("file", "absent") or change["b_kind"] not in ("file", "absent"):
        return None, f"{path}: {_kind(change['a_kind'], a)} → {_kind(change['b_kind'], b)}"
    if a == b:
        return None, f"{path}: mode {change['a_mode']:o} → {change['b_mode']:o}"
    if not (_is_text(a) and _is_text(b)):
        size = lambda d: "absent" if d is None else f"{len(d)} bytes"  # noqa: E731
        return None, f"Binary {path}: {size(a)} → {size(b)}"
    # The point after a tab, where diff -u puts a time: patch and git apply read the
    # name up to it (a name with spaces stays one name).
    lines = difflib.unified_diff(
        _lines(a), _lines(b),
        fromfile="/dev/null" if a is None else c_quoted("a/" + change["path"]),
        tofile="/dev/null" if b is None else c_quoted("b/" + change["path"]),
        fromfiledate="" if a is None else f"({a_name})",
        tofiledate="" if b is None else f"({b_name})")
    return _mode_header(change) + [_ended(line) for line in lines], None


# git's C quoting of a name in a patch header (quote_c_style): patch and git apply
# read it back, so a newline in a name neither forges a header nor names another file
_C_ESCAPES = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r",
              ord('"'): '\\"', ord("\\"): "\\\\"}


def c_quoted(name: str) -> str:
    """*name* as git writes a path to a program: as it is, or C-quoted when it holds a
    control character, a quote, a backslash or bytes that are not UTF-8 (valid UTF-8
    stays readable: git's ``core.quotePath=false``).  A quoted name is one line, and
    ``patch``/``git apply`` read it back."""
    raw = os.fsencode(name)
    try:
        raw.decode("utf-8")
        high = 0x100         # valid UTF-8: its letters stay as they are, quoted or not
    except UnicodeDecodeError:
        high = 0x80
    if high == 0x100 and not any(b < 0x20 or b == 0x7F or b in (0x22, 0x5C) for b in raw):
        return name
    out = bytearray(b'"')
    for ch in raw:
        esc = _C_ESCAPES.get(ch)
        out += esc.encode() if esc else (
            bytes([ch]) if 0x20 <= ch < 0x7F or 0x80 <= ch < high else b"\\%03o" % ch)
    return (out + b'"').decode()


def _lines(data: bytes | None) -> list[str]:
    """The lines of a file as diff and patch count them: ended by ``\\n`` only
    (``str.splitlines`` also ends a line at a form feed or a lone ``\\r``)."""
    parts = (data or b"").decode().split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _kind(kind: str, content: bytes | None) -> str:
    """A side that is not a file's content: its kind, and a symlink's target."""
    if kind == "symlink" and content is not None:
        return f"symlink to {_CONTROL.sub(_visible, os.fsdecode(content))}"
    return kind


def _mode_header(change: dict) -> list[str]:
    """git's extended header for a mode that changed beside the content (patch and
    git apply set it): nothing when it did not, or a side is absent."""
    if "file" != change["a_kind"] or "file" != change["b_kind"]:
        return []
    if change["a_mode"] == change["b_mode"]:
        return []
    regular = stat.S_IFREG      # git writes the file type too: 100644
    a, b = c_quoted("a/" + change["path"]), c_quoted("b/" + change["path"])
    return [f"diff --git {a} {b}\n", f"old mode {regular | change['a_mode']:o}\n",
            f"new mode {regular | change['b_mode']:o}\n"]


def _ended(line: str) -> str:
    """A diff line, ended: the last line of a file with no final newline gets the
    marker patch reads (without it the next line would run on)."""
    return line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"


_READ = ("file", "symlink")


def render_diff(out, res: dict, content) -> None:
    """``content(epoch_or_None, path) -> bytes | None`` fetches one side."""
    a_name = f"e{res['a']}"
    b_name = "now" if res.get("b") is None else f"e{res['b']}"
    for change in res["changes"]:
        # the sides whose bytes tell the change: a file's content, a symlink's target
        a = content(res["a"], change["path"]) if change["a_kind"] in _READ else None
        b = content(res.get("b"), change["path"]) if change["b_kind"] in _READ else None
        lines, summary = _diff_lines(change, a_name, b_name, a, b)
        if out.json:
            out.emit("diff.change", **change, diff="".join(lines) if lines else None,
                     summary=summary)
            continue
        if summary is not None:
            out.console.print(escape(summary), style="bold")
            continue
        if out.to_program():          # a patch into a file: the bytes patch reads
            out.write_raw("".join(lines))
            continue
        for line in lines:
            style = ("bold" if line.startswith(("---", "+++", "diff --git", "old mode",
                                                "new mode"))
                     else "green" if line[0] == "+" else "red" if line[0] == "-"
                     else "cyan" if line.startswith("@@") else None)
            # file content: tabs and line ends kept, other control characters shown
            shown = "\n".join(escape(part, keep_tabs=True) for part in line.split("\n"))
            out.console.print(shown, style=style, end="")
    if not res["changes"] and not out.json:
        out.say("no differences")


def change_status(change: dict) -> str:
    """git's --name-status letter of a change: A added, D deleted, T type changed,
    M modified (content, mode, owner, times or xattrs)."""
    if change["a_kind"] == "absent":
        return "A"
    if change["b_kind"] == "absent":
        return "D"
    return "T" if change["a_kind"] != change["b_kind"] else "M"


def render_names(out, res: dict, *, status: bool, nul: bool = False) -> None:
    """The changed paths alone (``diff --name-status``/``--name-only``): no content is
    fetched, and no "no differences" line, so the output is a list for scripts.  Names
    are written as git writes them: C-quoted when they need it, or, with ``nul`` (``-z``)
    into a file or pipe, as they are and ended by a NUL."""
    for change in res["changes"]:
        letter = change_status(change)
        if out.json:
            out.emit("diff.change", **change, status=letter)
            continue
        if nul and out.to_program():
            out.write_bytes((f"{letter}\0" if status else "").encode()
                            + os.fsencode(change["path"]) + b"\0")
            continue
        name = c_quoted(change["path"])          # one path per line, always
        line = f"{letter}\t{name}" if status else name
        if out.to_program():
            out.write_raw(line + "\n")
        else:
            out.say(escape(line, keep_tabs=True))


# -- gc -----------------------------------------------------------------------------------

def render_gc(out, report: dict) -> None:
    out.emit("gc", **report)
    if not report.get("dry_run"):
        out.say(", ".join(f"{k.replace('_', ' ')}: "
                          f"{human_bytes(v) if k.startswith('bytes') else v}"
                          for k, v in report.items()))
        return
    epochs = report["epochs"]
    out.say(f"gc --dry-run: would drop {len(epochs)} epoch(s) ({report['entries_dropped']} "
            f"pre-image entries) and remove {report['blobs_removed']} blob(s), "
            f"{human_bytes(report['bytes_freed'])}; nothing changed")
    for e in epochs:
        what = e["kind"] + (f" t{e['turn']} of {escape(e['session'])}"
                            if e["kind"] == "turn" and e.get("session") else "")
        label = f' "{escape(e["label"])}"' if e.get("label") else ""
        out.say(f"  e{e['epoch']}  {what}{label}  in {escape(e['workspace'])}")

