"""docs/errors.md is generated from the error classes (scripts/gen_errors_doc.py); this
test regenerates it in memory and fails when the page and the classes disagree, and
when the classes themselves would make a script's match ambiguous: a class without a
code of its own, two classes sharing a code with different exit codes or errnos."""

import difflib
import errno
import gc
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from rewindfs.store._errors import EXIT_COULD_NOT_RUN, EXIT_USAGE, RewindfsError

ROOT = Path(__file__).resolve().parents[2]


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_errors_doc",
                                                  ROOT / "scripts" / "gen_errors_doc.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


@pytest.fixture(scope="module")
def catalogue():
    return gen.collect()


def test_the_page_matches_the_classes(catalogue):
    want = gen.render(catalogue)
    have = gen.DOC.read_text()
    diff = "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                        "docs/errors.md", "generated"))
    assert have == want, f"docs/errors.md is stale; run scripts/gen_errors_doc.py\n{diff}"


def test_the_classes_have_no_problems(catalogue):
    assert gen.problems(catalogue) == []


def test_every_module_of_the_rooms_is_imported():
    """A class is found wherever it lives: every .py file under the three packages
    (subpackages too, so moving overlay modules into wings keeps them found) is one of
    the modules the generator imports."""
    imported = set(gen.import_all())
    for package in gen.PACKAGES:
        base = Path(importlib.import_module(package).__file__).parent
        for path in base.rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            assert ".".join((package, *parts)).rstrip(".") in imported, path


def test_the_page_names_every_code(catalogue):
    text = gen.DOC.read_text()
    codes = {c.code for c in catalogue.daemon} | {c.default_code for c in catalogue.client}
    codes |= set(catalogue.js)
    for code in codes:
        assert f"| `{code}` |" in text, code
    # The three sources are all there: a store refusal, a protocol error, the CLI's
    # safety net, a client-born code, the dsh plugin's refusals.
    assert {"turn-open", "bad-json", "internal", "daemon-unreachable"} <= codes
    assert {"busy", "bad-turn", "fork-failed"} <= set(catalogue.js)


def test_a_row_carries_exit_code_and_errno(catalogue):
    rows = {r.code: r for r in gen.daemon_rows(catalogue.daemon, catalogue.protocol_root)}
    assert (rows["bad-path"].exit_code, rows["bad-path"].errno_name) == (EXIT_USAGE, "EINVAL")
    assert (rows["store-full"].exit_code, rows["store-full"].errno_name) == (
        EXIT_COULD_NOT_RUN, "ENOSPC")
    assert rows["bad-params"].protocol and not rows["turn-open"].protocol


# -- the checks themselves catch what they are for (stand-in classes: a real subclass
#    of RewindfsError would stay visible to every other test in this process) ----------

class _Root:
    """{message}

    A stand-in root."""

    code = "error"
    exit_code = EXIT_COULD_NOT_RUN
    errno = errno.EIO


class _ClientRoot:
    """A stand-in client root."""

    default_code = "error"


def _catalogue(*classes, client=(), literals=(), js=None):
    return gen.Catalogue(_Root, [_Root, *classes], None, _ClientRoot, [_ClientRoot, *client],
                         list(literals), js or {"busy": "the agent is running"})


def test_a_sound_catalogue_has_no_problems():
    class Fine(_Root):
        """Fine {thing}."""

        code = "fine"

    assert gen.problems(_catalogue(Fine)) == []


def test_a_class_without_its_own_code_is_a_problem():
    class Forgot(_Root):
        """Forgot to set a code."""

    class ClientForgot(_ClientRoot):
        """Forgot too."""

    found = gen.problems(_catalogue(Forgot, client=[ClientForgot]))
    assert len(found) == 2, found
    assert "Forgot has no code of its own" in found[0]
    assert "ClientForgot has no default_code" in found[1]


@pytest.mark.parametrize("field, value", [("exit_code", EXIT_USAGE), ("errno", errno.EINVAL)])
def test_a_shared_code_with_another_exit_code_or_errno_is_a_problem(field, value):
    class One(_Root):
        """One."""

        code = "twice"

    class Two(_Root):
        """Two."""

        code = "twice"

    assert gen.problems(_catalogue(One, Two)) == []      # same code, same edges: fine
    setattr(Two, field, value)
    found = gen.problems(_catalogue(One, Two))
    assert len(found) == 1 and "share code 'twice'" in found[0], found


def test_other_problems_are_named():
    class NoDoc(_Root):
        code = "no-doc"

    class Snake(_Root):
        """Snake."""

        code = "snake_case"

    found = gen.problems(_catalogue(NoDoc, Snake, literals=[("made-up", "rewindfs.plugin.x")],
                                    js={"Bad": "x", "empty": ""}))
    assert any("no docstring" in p for p in found), found
    assert any("not kebab-case" in p for p in found), found
    assert any("writes code 'made-up', which no class defines" in p for p in found), found
    assert sum("plugin/dsh/lib/errors.js" in p for p in found) == 2, found


def test_codes_written_at_a_raise_are_found(tmp_path, catalogue):
    path = tmp_path / "raiser_of_a_test.py"
    path.write_text('def fail(err, Error):\n    err.code = "by-attribute"\n'
                    '    raise Error("x", code="by-keyword")\n\n'
                    'REPLY = {"code": "by-dict", "message": "m"}\n')
    spec = importlib.util.spec_from_file_location("raiser_of_a_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert gen.literal_codes([module]) == [
        ("by-attribute", "raiser_of_a_test"), ("by-dict", "raiser_of_a_test"),
        ("by-keyword", "raiser_of_a_test")]
    # and in the rooms: the spawn error the daemon writes as a dict, the client's own
    assert {"mount-failed", "too-large"} <= {code for code, _module in catalogue.literals}


def test_the_js_table_is_read_from_its_literal(tmp_path):
    js = tmp_path / "errors.js"
    js.write_text('/** doc */\nexport const CODES = Object.freeze({\n  "busy": "running",\n'
                  '  "bad-turn": "not a number"\n});\nexport function f() { return {}; }\n')
    assert gen.js_codes(js) == {"busy": "running", "bad-turn": "not a number"}
    js.write_text("export const TABLE = {};\n")
    with pytest.raises(ValueError, match="the table moved"):
        gen.js_codes(js)


def test_only_rewindfs_classes_count():
    """A subclass defined outside rewindfs (a test's) is not part of the contract."""
    class Outsider(RewindfsError):
        """Defined by a test."""

        code = "outsider-of-a-test"

    try:
        assert Outsider in RewindfsError.__subclasses__()
        assert Outsider not in gen.subclasses(RewindfsError)
        assert RewindfsError in gen.subclasses(RewindfsError)
    finally:
        del Outsider
        gc.collect()    # a class is in a reference cycle; drop it for the other tests
