"""The control socket's request parser, without a daemon (tests/mount/test_protocol.py
talks to a real one)."""

from __future__ import annotations

import pytest

from rewindfs.overlay.control.wire import parse_request
from rewindfs.overlay.errors import BadVersion


def test_parse_request_unit():
    assert parse_request(b'{"v":1,"id":3,"method":"m"}') == (3, "m", {})
    with pytest.raises(BadVersion) as exc:
        parse_request(b'{"v":9,"id":4,"method":"m"}')
    assert exc.value.request_id == 4
