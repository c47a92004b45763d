"""``rewindfs log --tree``: the state tree (``store._tree``) drawn for people, as
``jj log`` and ``git log --graph`` draw theirs.

Newest first, one column (lane) per open branch: a node takes the lane that waits for
it (its child's), or, as a branch tip, the first free lane — a lane that ends leaves a
hole rather than shifting the lanes right of it, so a line never jumps sideways.  When
several lanes wait for one node, a connector row (``├─╯``, ``├─┴─╯``; ``┼`` where a lane
that goes on is crossed) merges them into the leftmost just above it.  Glyphs: ``@`` the
current state, ``○`` a turn or idle epoch, ``↺`` a rewind, ``↻`` a redo.

Each row: lanes, ``eN`` (a POINT: what ``rewindfs rewind eN`` takes), what it is
(``s1 t2 "label"``, ``idle``, ``s1 rewind → t2 (e4)``, ``s1 redo of e9``), and, at the
right edge, its paths count and start time.  Rows fit the console's width: the
description is cut with ``…`` (session names and labels escaped first, ``render``).

Idle epochs that changed nothing (every turn end opens one) are folded away unless
``all_nodes``: a child of such an epoch is drawn under the epoch's own parent, which
is the same state.  Never folded: the current epoch, a rewind's or redo's target.
Epochs that started from the root (the first one, and those after a rewind to it) all
hang under one drawn ``◆ root`` row when there are several, so the drawing stays one
tree and a new tip never seems to continue a branch that ended.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text

from rewindfs.overlay.cli.render import escape, truncate, when

__all__ = ["NODE", "fold_quiet_idle", "layout", "render_tree"]

NODE = "*"                  # the node's place in a ``layout`` row (the glyph goes there)
_GLYPH = {"rewind": "↺", "redo": "↻"}
_ROOT = 0                   # the drawn root (epoch ids start at 1), when several hang there
_STYLE = {"idle": "dim", "rewind": "magenta", "redo": "cyan"}


# -- lanes --------------------------------------------------------------------------------

def layout(order: list[int], parent_of: dict[int, int | None]) -> list[tuple[int | None, str]]:
    """The graph column of each row: ``(node id, text)`` for a node's row (``NODE``
    marks the node), ``(None, text)`` for a connector row.  ``order``: the node ids in
    drawing order (every parent after its children); a parent not drawn below its child
    counts as none (the lane ends there)."""
    pos = {nid: i for i, nid in enumerate(order)}
    lanes: list[int | None] = []        # lane → the node it waits for; None: a hole
    rows: list[tuple[int | None, str]] = []
    for nid in order:
        waiting = [i for i, w in enumerate(lanes) if w == nid]
        if waiting:
            col = waiting[0]
            if len(waiting) > 1:
                rows.append((None, _merge_row(lanes, col, waiting[1:])))
                for i in waiting[1:]:
                    lanes[i] = None
        else:
            col = _free_lane(lanes)
        cells = ["│" if w is not None else " " for w in lanes]
        cells[col] = NODE
        rows.append((nid, " ".join(cells).rstrip()))
        parent = parent_of.get(nid)
        lanes[col] = parent if parent in pos and pos[parent] > pos[nid] else None
        while lanes and lanes[-1] is None:
            lanes.pop()
    return rows


def _free_lane(lanes: list[int | None]) -> int:
    for i, w in enumerate(lanes):
        if w is None:
            return i
    lanes.append(None)
    return len(lanes) - 1


def _merge_row(lanes: list[int | None], col: int, merging: list[int]) -> str:
    """``├─╯``-style: lanes ``merging`` (right of ``col``) bend into lane ``col``."""
    last = merging[-1]
    out = []
    for i, w in enumerate(lanes):
        if i == col:
            out.append("├")
        elif i in merging:
            out.append("╯" if i == last else "┴")
        elif col < i < last:
            out.append("┼" if w is not None else "─")
        else:
            out.append("│" if w is not None else " ")
        if i < len(lanes) - 1:
            out.append("─" if col <= i < last else " ")
    return "".join(out).rstrip()


# -- which nodes are drawn ------------------------------------------------------------------

def fold_quiet_idle(nodes: list[dict]) -> tuple[list[dict], dict[int, int | None]]:
    """The nodes to draw and each one's drawn parent: idle epochs that changed nothing
    are left out (see the module doc); their children hang under their parent."""
    targets = {n["target"] for n in nodes if n["kind"] in ("rewind", "redo")}
    quiet = {n["epoch"]: n["parent"] for n in nodes
             if n["kind"] == "idle" and not n.get("paths") and not n["current"]
             and n["epoch"] not in targets}

    def drawn(parent):
        while parent in quiet:
            parent = quiet[parent]
        return parent

    kept = [n for n in nodes if n["epoch"] not in quiet]
    return kept, {n["epoch"]: drawn(n["parent"]) for n in kept}


# -- rows ---------------------------------------------------------------------------------

def describe(node: dict, by_id: dict[int, dict]) -> str:
    """What the node is, for people (escaped, not yet cut)."""
    kind, session = node["kind"], node.get("session")
    who = escape(session, markup=False) + " " if session else ""
    if kind == "turn":
        text = f"{who}t{node['turn']}"
        fork = node.get("fork")
        if fork:
            at = f" at t{fork['turn']}" if fork.get("turn") is not None else ""
            text += f" (fork of {escape(fork['session'], markup=False)}{at})"
        label = node.get("label")
        return text + (f' "{escape(label, markup=False)}"' if label else "")
    if kind == "rewind":
        return f"{who}rewind → {_point_name(node.get('target'), session, by_id)}"
    if kind == "redo":
        return f"{who}redo of e{node.get('target')}"
    label = node.get("label")      # an idle epoch a run started: "run: make test"
    return kind + (f' "{escape(label, markup=False)}"' if label else "")


def _point_name(target, owner, by_id) -> str:
    t = by_id.get(target)
    if t is None or t["kind"] != "turn":
        return f"e{target}"
    whose = "" if t.get("session") == owner else escape(t.get("session") or "", markup=False) + " "
    return f"{whose}t{t['turn']} (e{target})"


def _facts(node: dict) -> str:
    n = node.get("paths", 0)
    return f"{n} path{'' if n == 1 else 's'}  {when(node.get('started_ns'))}".rstrip()


def render_tree(out, nodes: list[dict], *, all_nodes: bool = False,
                limit: int | None = None) -> None:
    """Draw ``nodes`` (``history`` wire dicts, any order) on ``out``'s console, one row
    per line, each at most the console's width; with *limit*, the newest *limit* drawn
    nodes only (``log -n``).  With ``in_session`` present on the nodes
    (``--session``), the others are dimmed."""
    if not nodes:
        out.say("no history yet")
        return
    by_id = {n["epoch"]: n for n in nodes}
    order, parent_of = _drawn(nodes, all_nodes)
    width = out.console.width
    id_width = max(len(f"e{nid}") for nid in order)
    for nid, graph in layout(order, parent_of):
        if nid is not None and limit is not None:
            if limit == 0:
                break
            limit -= 1
        text = Text(no_wrap=True, overflow="crop")
        if nid is None:
            text.append(graph[:width])
        elif nid == _ROOT:
            _root_row(text, graph, min(by_id), width)
        else:
            _node_row(text, by_id[nid], graph, id_width, width, by_id)
        out.console.print(text, soft_wrap=False, crop=True)


def _drawn(nodes: list[dict], all_nodes: bool) -> tuple[list[int], dict]:
    """The ids to draw, newest first, and each one's drawn parent (``_ROOT`` added
    under the roots when there are several: one tree, one root)."""
    kept, parent_of = (nodes, {n["epoch"]: n["parent"] for n in nodes}) if all_nodes \
        else fold_quiet_idle(nodes)
    order = sorted((n["epoch"] for n in kept), reverse=True)
    roots = [nid for nid in order if parent_of[nid] is None]
    if len(roots) > 1:      # e.g. a rewind to the very first point
        order.append(_ROOT)
        parent_of.update((nid, _ROOT) for nid in roots)
    return order, parent_of


def _root_row(text: Text, graph: str, first: int, width: int) -> None:
    lead, _, rest = graph.partition(NODE)
    text.append(f"{lead}◆{rest} ")
    text.append(truncate(f"root  the state before e{first} (point e{first})",
                         width - cell_len(lead + rest) - 2), style="dim")


def _node_row(text: Text, node: dict, graph: str, id_width: int, width: int, by_id) -> None:
    glyph = "@" if node["current"] else _GLYPH.get(node["kind"], "○")
    lead, _, rest = graph.partition(NODE)
    style = "bold" if node["current"] else _STYLE.get(node["kind"], "")
    if node.get("in_session") is False:
        style = "dim"
    head = f"{lead}{glyph}{rest} "
    name = f"e{node['epoch']}".ljust(id_width)
    facts = _facts(node)
    room = width - cell_len(head) - len(name) - 2 - 2 - cell_len(facts)
    if room < 12:          # too narrow for both: the description goes first
        facts, room = "", width - cell_len(head) - len(name) - 2
    desc = truncate(describe(node, by_id), room)
    text.append(lead)
    text.append(glyph, style="bold" if node["current"] else style)
    text.append(rest + " ")
    text.append(name, style="bold")
    text.append("  " + desc, style=style)
    if facts:
        pad = width - cell_len(head) - len(name) - 2 - cell_len(desc) - cell_len(facts)
        text.append(" " * max(pad, 2) + facts, style="dim")
    text.truncate(width)
