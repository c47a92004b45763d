"""The agent-loop API and the trio client against the real daemon on a real mount.

The same API as tests/unit/test_plugin_client.py checks against a scripted socket
server; here the answers come from ``rewindfs mount`` itself.
"""

from __future__ import annotations

import os

import pytest

from rewindfs.plugin import Rewindfs, RewindfsClientError, TrioClient


@pytest.mark.mount
def test_agent_api_against_the_real_daemon(tmp_path):
    """The agent-loop API end to end: turns, points, rewind and redo on a real mount."""
    from mountkit import mounted

    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "keep.txt").write_text("v0\n")
    with mounted(ws, store):
        (ws / "sub").mkdir()
        with Rewindfs.for_directory(ws / "sub", store=store, strict=True) as rw:
            with rw.turn("agent-1", 1, "create\nsecond line") as t1:
                assert t1.protected
                (ws / "keep.txt").write_text("v1\n")
                (ws / "sub" / "new.bin").write_bytes(b"\0\1\2")
            with rw.turn("agent-1", 2, "change"):
                (ws / "keep.txt").write_text("v2\n")
                (ws / "sub" / "new.bin").unlink()
            turns = [(p.turn, p.label) for p in rw.points("agent-1") if p.kind == "turn"]
            assert turns == [(1, "create"), (2, "change")]
            result = rw.rewind(2, session="agent-1")
            assert not result.partial
            # keep.txt given its old content, new.bin brought back
            assert (result.written, result.created, result.deleted) == (1, 1, 0)
            assert (ws / "keep.txt").read_text() == "v1\n"
            assert (ws / "sub" / "new.bin").read_bytes() == b"\0\1\2"
            with pytest.raises(RewindfsClientError) as exc:
                rw.rewind(3, session="agent-1")
            assert exc.value.code == "unknown-point"
            rw.redo(session="agent-1")
            assert (ws / "keep.txt").read_text() == "v2\n"
            assert not (ws / "sub" / "new.bin").exists()
            rw.rewind(1, session="agent-1")
            assert (ws / "keep.txt").read_text() == "v0\n"
            assert os.listdir(ws / "sub") == []  # made before turn 1, so kept


@pytest.mark.mount
async def test_trio_client_against_the_real_daemon(tmp_path):
    from mountkit import mounted

    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    with mounted(ws, store):
        async with TrioClient.for_directory(ws, store=store) as c:
            status = await c.status()
            assert os.path.realpath(status.workspace) == os.path.realpath(ws)
            assert status.open_turn is None
            epoch = await c.turn_begin("t", 1, "x")
            assert (await c.status()).open_turn["epoch"] == epoch
            with pytest.raises(RewindfsClientError) as exc:
                await c.call("no.such.method")
            assert exc.value.code == "unknown-method"
            assert await c.turn_end("t") > epoch


@pytest.mark.mount
def test_a_dead_daemon_is_named_with_the_command_that_brings_the_workspace_back(
        tmp_path, caplog):
    """The daemon is killed under an agent loop (OOM killer, ``kill -9``): its socket
    file stays and nobody listens.  The error, and the agent API's warning that turns
    run unprotected, say what a person runs next, as the CLI's ``stale-mount`` does."""
    import signal

    from mountkit import mounted

    from rewindfs.plugin import Client, DaemonUnreachable

    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    with mounted(ws, store, require_clean=False) as m:
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait()
        hint = f"`rewindfs mount --recover {ws}` brings the workspace back"
        with Client.for_directory(ws, store=store) as client:
            with pytest.raises(DaemonUnreachable) as exc:
                client.status()
        assert exc.value.code == "daemon-unreachable"
        assert hint in exc.value.message, exc.value.message
        with caplog.at_level("WARNING", logger="rewindfs"):
            with Rewindfs.for_directory(ws, store=store) as rw:
                with rw.turn("agent-1", 1, "x") as t1:
                    assert not t1.protected
        assert hint in caplog.text, caplog.text
        with Rewindfs.for_directory(ws, store=store, strict=True) as rw:
            with pytest.raises(DaemonUnreachable) as exc:
                with rw.turn("agent-1", 1, "x"):
                    pass
        assert hint in exc.value.message, exc.value.message
