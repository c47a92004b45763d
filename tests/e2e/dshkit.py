"""Driving the real DeepSeek Harness (dsh) in tests.

- :func:`harness` installs the pinned harness with ``scripts/setup-dsh.sh`` into
  ``$REWINDFS_DSH_PREFIX`` (default ``<repo>/.dsh``; idempotent, seconds when present)
  and returns its paths.  Nothing is skipped: no harness, no pass.
- :class:`MockModel` runs ``mock_model.py`` as a subprocess on an ephemeral port.
- :class:`Dsh` is one isolated harness home (fresh ``DSH_HOME``/``DSH_AGENTS_HOME``,
  telemetry off, full access, session logs as plain JSONL) with the test runner
  (``runner/index.js``) in place of the one-shot rows; :meth:`Dsh.run` drives it
  and returns the runner's ``RWE2E`` records.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PLUGIN = ROOT / "plugin" / "dsh"


def harness() -> dict:
    """Install (or find) the pinned harness; returns setup-dsh.sh's KEY=VALUE paths."""
    prefix = os.environ.get("REWINDFS_DSH_PREFIX") or str(ROOT / ".dsh")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup-dsh.sh"), prefix],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"setup-dsh.sh failed:\n{proc.stderr[-4000:]}"
    paths = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert pathlib.Path(paths["DSH_JS"]).is_file(), paths
    return paths


class MockModel:
    """The scripted model endpoint (see mock_model.py); a context manager."""

    def __init__(self, script: dict, workdir: pathlib.Path):
        self.script_path = workdir / "model-script.json"
        self.log_path = workdir / "model-requests.jsonl"
        self.script_path.write_text(json.dumps(script))
        self.proc = None
        self.url = None

    def __enter__(self):
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "mock_model.py"), str(self.script_path), str(self.log_path)],
            stdout=subprocess.PIPE, text=True)
        first = self.proc.stdout.readline()
        assert first.startswith("PORT "), f"mock model did not start: {first!r}"
        self.url = f"http://127.0.0.1:{int(first.split()[1])}"
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def requests(self) -> list[dict]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines()]


OVERLAY = """\
- id: headless-startup
  disabled: true
- id: headless-runner
  disabled: true
- id: session-persistence-jsonl
  config: {{root: !!js dshHomePath('sessions'), compression: none, packChunks: false}}
- insert:
    - id: rewindfs-e2e-runner
      name: '{runner}'
"""


class Dsh:
    """One isolated harness home with the rewindfs plugin installed into ``headless``."""

    def __init__(self, paths: dict, workdir: pathlib.Path, model: MockModel, store: pathlib.Path):
        self.paths = paths
        self.home = workdir / "dsh-home"
        self.agents = workdir / "dsh-agents"
        self.home.mkdir()
        self.agents.mkdir()
        # the harness spills tool output into os.tmpdir(); keep it in the test's own
        # directory, so a run leaves nothing behind in /tmp
        self.tmp = workdir / "tmp"
        self.tmp.mkdir()
        self.overlay = workdir / "runner-overlay.yml"
        self.overlay.write_text(OVERLAY.format(runner=HERE / "runner" / "index.js"))
        path = paths["PATH_PREFIX"] + os.pathsep + os.environ.get("PATH", "")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("DSH_", "DEEPSEEK_"))}
        self.env.update(PATH=path, DSH_HOME=str(self.home), DSH_AGENTS_HOME=str(self.agents),
                        DSH_TELEMETRY_DISABLED="1", DSH_PERMISSION_MODE="danger-full-access",
                        DEEPSEEK_BASE_URL=model.url, DEEPSEEK_API_KEY="test-key",
                        REWINDFS_HOME=str(store), TMPDIR=str(self.tmp))

    def dsh(self, *args, cwd, extra_env=None, timeout=None) -> subprocess.CompletedProcess:
        timeout = timeout or int(os.environ.get("REWINDFS_E2E_TIMEOUT", "180"))
        env = dict(self.env, **(extra_env or {}))
        try:
            return subprocess.run([self.paths["DSH_BIN"], *args], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            raise AssertionError(f"dsh {' '.join(args)} did not finish in {timeout} s\n"
                                 f"stdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}") from None

    def install_plugin(self, cwd, profile="headless") -> subprocess.CompletedProcess:
        """``dsh plugin --profile <profile> add -w <abs path>``, checked with --dump-config."""
        added = self.dsh("plugin", "--profile", profile, "add", "-w", str(PLUGIN), cwd=cwd)
        assert added.returncode == 0, added.stderr[-3000:]
        dump = self.dsh("--profile", profile, "--dump-config", cwd=cwd)
        assert dump.returncode == 0, dump.stderr[-3000:]
        assert "id: rewindfs" in dump.stdout and "name: rewindfs-dsh" in dump.stdout
        return added

    def run(self, cwd, *, steps, session=None, new_session=None, patches=(), expect_rc=0):
        """Run the runner with these steps; returns (records, completed process)."""
        action = {"steps": steps}
        if session:
            action["session"] = session
        if new_session:
            action["new_session"] = new_session
        args = ["--profile", "headless", "--patch", str(self.overlay)]
        for p in patches:
            args += ["--patch", str(p)]
        proc = self.dsh(*args, cwd=cwd, extra_env={"REWINDFS_E2E_ACTION": json.dumps(action), "REWINDFS_DSH_DEBUG": "1"})
        records = [json.loads(line[6:]) for line in proc.stdout.splitlines() if line.startswith("RWE2E ")]
        if expect_rc is not None:
            assert proc.returncode == expect_rc, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        return records, proc

    def session_log(self, session_id: str) -> list[dict]:
        """The persisted session (header first, then events), plain JSONL."""
        found = list((self.home / "sessions").glob(f"*/{session_id}/session.jsonl"))
        assert len(found) == 1, f"session {session_id}: {found}"
        return [json.loads(line) for line in found[0].read_text().splitlines() if line.strip()]

