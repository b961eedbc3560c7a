"""The server's log, bounded: a public app's log takes what requests carry (a refused value, a
traceback), so each line is cut at LOG_LINE_CHARS and at most LOG_MINUTE_CHARS characters a
minute are written, the rest counted in one line when the minute ends. app.py puts it in front of
stdout and stderr in public mode, before Gradio and uvicorn start."""

from __future__ import annotations

import io
import sys
import threading
import time

LOG_LINE_CHARS = 2000  # a traceback's lines are far shorter; a value printed whole is not
LOG_MINUTE_CHARS = 200_000  # about 12 MB an hour at most, however a client probes


class BoundedLog(io.TextIOBase):
    """A text stream that writes to `stream` at most `minute_chars` characters a minute, each line
    cut at `line_chars`."""

    def __init__(self, stream, line_chars: int = LOG_LINE_CHARS, minute_chars: int = LOG_MINUTE_CHARS,
                 clock=time.monotonic):
        self.stream, self.line_chars, self.minute_chars, self.clock = stream, line_chars, minute_chars, clock
        self.lock = threading.Lock()
        self.minute, self.used, self.dropped = clock(), 0, 0

    def write(self, text: str) -> int:
        with self.lock:
            now = self.clock()
            if now - self.minute >= 60:
                if self.dropped:
                    self.stream.write(f"[speclens] log: {self.dropped:,} characters dropped in the last minute\n")
                self.minute, self.used, self.dropped = now, 0, 0
            out = self._cut(text)
            if self.used + len(out) > self.minute_chars:
                self.dropped += len(out)
            else:
                self.used += len(out)
                self.stream.write(out)
        return len(text)

    def _cut(self, text: str) -> str:
        if len(text) <= self.line_chars:
            return text
        lines = []
        for line in text.splitlines(keepends=True):
            if len(line) > self.line_chars:
                line = f"{line[:self.line_chars]}… ({len(line) - self.line_chars:,} characters cut)\n"
            lines.append(line)
        return "".join(lines)

    def flush(self) -> None:
        self.stream.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self):
        return self.stream.encoding


def bound_log() -> None:
    """Put a BoundedLog in front of stdout and stderr (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, BoundedLog):
            setattr(sys, name, BoundedLog(stream))
