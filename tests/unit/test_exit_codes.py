"""The README's exit-code table and the error classes agree (no table copied by hand)."""

import re
from pathlib import Path

# Import every module that defines error classes, so all_error_classes() sees them.
import rewindfs.overlay  # noqa: F401
import rewindfs.overlay.cli.rewind  # noqa: F401
import rewindfs.overlay.cli.render  # noqa: F401
import rewindfs.overlay.rewind.diff  # noqa: F401
import rewindfs.overlay.rewind.engine  # noqa: F401
import rewindfs.plugin  # noqa: F401
from rewindfs import store
from rewindfs.store._errors import EXIT_COULD_NOT_RUN, EXIT_PARTIAL, EXIT_USAGE, all_error_classes

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_exit_codes() -> dict[int, str]:
    rows = re.findall(r"^\| (\d) \| ([^|]+) \|$", README.read_text(), re.M)
    return {int(code): text.strip() for code, text in rows}


def test_every_error_class_uses_a_documented_exit_code():
    table = readme_exit_codes()
    assert set(table) == {0, 1, 2, 3}
    for cls in all_error_classes():
        assert cls.exit_code in table, cls
        assert cls.exit_code != 0, cls


def test_codes_are_unique_and_kebab_case():
    codes = {}
    for cls in all_error_classes():
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", cls.code), cls
        assert codes.setdefault(cls.code, cls) is cls, f"{cls} and {codes[cls.code]} share {cls.code}"


def test_usage_errors_exit_3_and_refusals_exit_2():
    assert store.BadPath.exit_code == EXIT_USAGE
    assert store.BadPoint.exit_code == EXIT_USAGE
    assert store.UnknownPoint.exit_code == EXIT_COULD_NOT_RUN
    assert store.TurnOpen.exit_code == EXIT_COULD_NOT_RUN
    assert EXIT_PARTIAL == 1
