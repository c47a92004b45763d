"""A scripted chat-completions endpoint the harness takes for a real model.

Stdlib only.  Listens on 127.0.0.1 (an ephemeral port unless given), answers
``POST /chat/completions`` with OpenAI-style SSE chunks ending in ``data: [DONE]``.

Script (JSON file)::

    {"turns": {"<prompt text>": [ {"content": "text", "tool_calls": [{"name": "bash",
                 "arguments": {"command": "...", "description": "..."}}]},
                                  {"content": "done"} ]},
     "steps": [ ... ],
     "title": "Scripted session"}

The reply to a request is ``turns[P][k]`` where P is the text of the newest user
message that names a scripted turn and k the number of ``assistant`` messages after
it; without such a message it is ``steps[k]`` with k counting every assistant
message.  The mock is stateless, so one script drives a whole multi-turn
conversation across harness restarts, resumed and forked sessions.  A step
with ``tool_calls`` makes the harness run them and come back; a step without ends
the turn.  A request without ``tools`` is the harness's title request and gets
``title``.  A request past the script's end is answered 400 (fail fast; 5xx would
be retried).  Every request body is appended, one JSON object a line, to the log
file, so tests can assert what the model was shown.

Run: ``python mock_model.py SCRIPT LOG [--port N]``; prints ``PORT <n>`` on stdout
once listening, then serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "mock",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def sse_reply(step: dict, call_prefix: str) -> list[bytes]:
    """The SSE chunks for one scripted step (text first, then each tool call)."""
    out = [_chunk({"role": "assistant", "content": ""})]
    if step.get("content"):
        out.append(_chunk({"content": step["content"]}))
    calls = step.get("tool_calls") or []
    for i, call in enumerate(calls):
        args = call.get("arguments", {})
        out.append(_chunk({"tool_calls": [{
            "index": i,
            "id": call.get("id") or f"{call_prefix}_{i}",
            "type": "function",
            "function": {"name": call["name"],
                         "arguments": args if isinstance(args, str) else json.dumps(args)},
        }]}))
    out.append(_chunk({}, "tool_calls" if calls else "stop"))
    usage = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "model": "mock",
             "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5,
                                      "total_tokens": 15}}
    out.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


class MockModel(ThreadingHTTPServer):
    """The server; ``script`` and ``log_path`` are read by the handler."""

    daemon_threads = True

    def __init__(self, script: dict, log_path: str, port: int = 0):
        super().__init__(("127.0.0.1", port), _Handler)
        self.script = script
        self.log_path = log_path
        self._log_lock = threading.Lock()
        self._serial = 0

    def next_serial(self) -> int:
        """A fresh number per reply, so tool call ids never repeat in one session."""
        with self._log_lock:
            self._serial += 1
            return self._serial

    def log_request_body(self, body: dict) -> None:
        with self._log_lock, open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(body) + "\n")

    def reply_for(self, body: dict) -> dict | None:
        """The step to answer, or None when the script has none."""
        if not body.get("tools"):
            return {"content": self.script.get("title", "Scripted session")}
        messages = body.get("messages", [])
        turns = self.script.get("turns", {})
        steps, start = self.script.get("steps", []), 0
        for i in range(len(messages) - 1, -1, -1):
            if messages[i].get("role") == "user" and _text(messages[i]).strip() in turns:
                steps, start = turns[_text(messages[i]).strip()], i + 1
                break
        k = sum(1 for m in messages[start:] if m.get("role") == "assistant")
        return steps[k] if k < len(steps) else None


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class _Handler(BaseHTTPRequestHandler):
    server: MockModel
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # keep the test output quiet
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self._error(400, "bad json")
        self.server.log_request_body(body)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._error(404, f"no route {self.path}")
        step = self.server.reply_for(body)
        if step is None:
            return self._error(400, "script exhausted")
        n = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        chunks = sse_reply(step, f"call_{n}_{self.server.next_serial()}")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(sum(map(len, chunks))))
        self.end_headers()
        for c in chunks:
            self.wfile.write(c)
        self.wfile.flush()

    def _error(self, status: int, message: str):
        data = json.dumps({"error": {"message": message, "type": "mock"}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("script")
    ap.add_argument("log")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    with open(args.script, encoding="utf-8") as f:
        script = json.load(f)
    server = MockModel(script, args.log, args.port)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
