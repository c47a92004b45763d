"""Model test of the point rule: random epochs of random mutations on an in-memory tree,
recorded as the overlay would, then ``plan(E)`` applied to the final tree must give the
tree as it stood at the start of E — for every E, and again after stacked rewinds and
redos."""

from __future__ import annotations

import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pointcheck import Node, diff_trees
from rewindfs.store import PreImage, Store
from store_fixtures import assert_sound

NAMES = [b"a", b"b", b"c", b"\xff"]     # \xff: names that are not UTF-8 round-trip
CONTENTS = [b"", b"x", b"hello", b"other content", bytes(range(256)) * 3]
MODES = [0o644, 0o600, 0o755]


# -- the model tree ------------------------------------------------------------------
def parent(path: bytes) -> bytes:
    return path.rpartition(b"/")[0]


def subtree(tree, top: bytes) -> list[bytes]:
    return sorted(p for p in tree if p == top or p.startswith(top + b"/"))


def children(tree, d: bytes) -> list[bytes]:
    return [p for p in tree if parent(p) == d and p != d]


def image_of(store: Store, tree, path: bytes) -> PreImage:
    node = tree.get(path)
    if node is None:
        return PreImage.ABSENT
    if node.kind == "file":
        key, size = store.put_bytes(node.data)
        return PreImage("file", node.mode, size=size, blob=key)
    if node.kind == "symlink":
        return PreImage("symlink", target=node.data)
    return PreImage("dir", node.mode)


def node_of(store: Store, img: PreImage) -> Node:
    if img.kind == "file":
        return Node("file", img.mode, store.read_blob(img.blob))
    if img.kind == "symlink":
        return Node("symlink", 0, img.target)
    return Node(img.kind, img.mode)


class World:
    """The model tree plus the store it is recorded into."""

    def __init__(self, store: Store, ws: int):
        self.store, self.ws = store, ws
        self.tree: dict[bytes, Node] = {}
        self.at: dict[int, dict[bytes, Node]] = {}   # epoch id → tree at its start
        self.epoch = store.current_epoch(ws).id
        self.at[self.epoch] = dict(self.tree)

    def opened(self, epoch_id: int) -> None:
        self.epoch = epoch_id
        self.at.setdefault(epoch_id, dict(self.tree))

    def capture(self, paths) -> None:
        """Write-ahead: record every affected path before the mutation."""
        self.store.record(self.ws, self.epoch, [(p, image_of(self.store, self.tree, p))
                                                for p in paths])

    # mutations: each records its pre-images first, exactly as the overlay does
    def write(self, path, data, mode):
        self.capture([path])
        old = self.tree.get(path)
        self.tree[path] = Node("file", old.mode if old else mode, data)

    def delete(self, path):
        self.capture([path])
        del self.tree[path]

    def mkdir(self, path, mode):
        self.capture([path])
        self.tree[path] = Node("dir", mode)

    def symlink(self, path, target):
        self.capture([path])
        self.tree[path] = Node("symlink", 0, target)

    def chmod(self, path, mode):
        self.capture([path])
        n = self.tree[path]
        self.tree[path] = Node(n.kind, mode, n.data)

    def rename(self, src, dst):
        moved = subtree(self.tree, src)
        dests = [dst + p[len(src):] for p in moved]
        self.capture(moved + subtree(self.tree, dst) + dests)
        nodes = {dst + p[len(src):]: self.tree.pop(p) for p in moved}
        for p in subtree(self.tree, dst):
            del self.tree[p]
        self.tree.update(nodes)


# -- applying a plan to a model tree ---------------------------------------------------
def apply(store: Store, tree: dict, plan) -> None:
    for a in plan:
        if a.op == "delete":
            assert not children(tree, a.path), f"delete of non-empty {a.path!r}"
            tree.pop(a.path, None)
        elif a.op == "meta":
            assert tree[a.path].kind == "dir"
            tree[a.path] = Node("dir", a.image.mode)
        else:
            assert parent(a.path) == b"" or tree.get(parent(a.path), Node("x")).kind == "dir", \
                f"{a.op} {a.path!r} before its parent"
            old = tree.get(a.path)
            if old is not None and a.op == "mkdir" and old.kind == "dir":
                continue
            if old is not None:
                assert not children(tree, a.path), f"replacing non-empty {a.path!r}"
            tree[a.path] = node_of(store, a.image)


def rewind(w: World, target: int, session: str) -> None:
    """A rewind as the restore engine runs it: its own epoch, pre-images of what it
    changes, then the plan lands."""
    plan = w.store.plan(w.ws, target)
    e = w.store.begin_rewind(w.ws, target, session)
    w.opened(e.id)
    w.capture([a.path for a in plan if a.op != "meta"])
    apply(w.store, w.tree, plan)
    w.opened(w.store.end_rewind(w.ws).id)


def check_every_point(w: World) -> None:
    for eid, expected in w.at.items():
        tree = dict(w.tree)
        apply(w.store, tree, w.store.plan(w.ws, eid))
        assert diff_trees(expected, tree) == [], f"point {eid}"


def check_partial_points(w: World, top: bytes) -> None:
    """plan(E, [top]) restores top's subtree only; everything else stays current."""
    for eid, at_e in w.at.items():
        tree = dict(w.tree)
        apply(w.store, tree, w.store.plan(w.ws, eid, [top]))
        expected = {p: n for p, n in w.tree.items() if p not in subtree(w.tree, top)}
        expected.update({p: at_e[p] for p in subtree(at_e, top)})
        assert diff_trees(expected, tree) == [], f"point {eid}, paths [{top!r}]"


# -- drawing random mutations ----------------------------------------------------------
def mutate(draw, w: World) -> None:
    tree = w.tree
    dirs = [b""] + [p for p, n in tree.items() if n.kind == "dir"]
    d = draw(st.sampled_from(dirs))
    name = draw(st.sampled_from(NAMES))
    path = d + b"/" + name if d else name
    node = tree.get(path)
    ops = []
    if node is None:
        ops += ["create", "mkdir", "symlink"]
    elif node.kind == "file":
        ops += ["write", "delete", "chmod"]
    elif node.kind == "symlink":
        ops += ["delete"]
    elif node.kind == "dir":
        ops += ["chmod"] + ([] if children(tree, path) else ["rmdir"])
    if node is not None:
        ops.append("rename")
    op = draw(st.sampled_from(ops))
    if op in ("create", "write"):
        w.write(path, draw(st.sampled_from(CONTENTS)), draw(st.sampled_from(MODES)))
    elif op in ("delete", "rmdir"):
        w.delete(path)
    elif op == "mkdir":
        w.mkdir(path, draw(st.sampled_from(MODES)))
    elif op == "symlink":
        w.symlink(path, draw(st.sampled_from([b"a", b"../x", b"/etc/passwd", b"\xfe"])))
    elif op == "chmod":
        w.chmod(path, draw(st.sampled_from(MODES)))
    else:
        rename_somewhere(draw, w, path)


def rename_somewhere(draw, w: World, src: bytes) -> None:
    dirs = [b""] + [p for p, n in w.tree.items() if n.kind == "dir"
                    and p != src and not p.startswith(src + b"/")]
    d = draw(st.sampled_from(dirs))
    dst = (d + b"/" if d else b"") + draw(st.sampled_from(NAMES + [b"r"]))
    old = w.tree.get(dst)
    if dst == src or (old is not None and (old.kind == "dir") != (w.tree[src].kind == "dir")):
        return
    if old is not None and old.kind == "dir" and children(w.tree, dst):
        return
    w.rename(src, dst)


def run_history(draw, w: World) -> None:
    for turn in range(1, draw(st.integers(1, 5)) + 1):
        w.opened(w.store.begin_turn(w.ws, "s1", turn, f"turn {turn}").id)
        for _ in range(draw(st.integers(0, 6))):
            mutate(draw, w)
        w.opened(w.store.end_turn(w.ws).id)
        for _ in range(draw(st.integers(0, 2))):   # idle edits by a person
            mutate(draw, w)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_plan_reaches_every_point(data):
    with tempfile.TemporaryDirectory() as tmp, Store.open(tmp + "/store") as store:
        w = World(store, store.workspace(tmp.encode() + b"/ws"))
        run_history(data.draw, w)
        check_every_point(w)
        check_partial_points(w, data.draw(st.sampled_from(NAMES)))
        assert_sound(store)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_rewinds_and_redos_stack(data):
    with tempfile.TemporaryDirectory() as tmp, Store.open(tmp + "/store") as store:
        w = World(store, store.workspace(tmp.encode() + b"/ws"))
        run_history(data.draw, w)
        for _ in range(data.draw(st.integers(1, 4))):
            stack = store.redo_stacks(w.ws).get("s1")
            if data.draw(st.booleans()) and stack:
                target = stack[-1].id          # back to where the newest rewind left
            else:
                target = data.draw(st.sampled_from(sorted(w.at)))
            expected = dict(w.at[target])
            rewind(w, target, "s1")
            assert diff_trees(expected, w.tree) == [], f"rewind to {target}"
            for _ in range(data.draw(st.integers(0, 3))):
                mutate(data.draw, w)
        check_every_point(w)
        assert_sound(store)
