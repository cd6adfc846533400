"""Progress display for long steps (tracing, compiling): on a terminal only.

``with progress("tracing model.py:loss"):`` shows ``tracing model.py:loss ... 3.2s``
on stderr, updated a few times a second while the block runs, and erases it when
the block ends.  When stderr is not a terminal (a pipe, a log file, a test) it shows
nothing, so output stays clean for scripts.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

_FIRST_DELAY = 0.5   # steps shorter than this show nothing at all
_INTERVAL = 0.25


def _enabled(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


@contextlib.contextmanager
def progress(message: str, stream=None):
    stream = sys.stderr if stream is None else stream
    if not _enabled(stream):
        yield
        return
    done = threading.Event()
    start = time.perf_counter()
    shown = [False]

    def tick():
        if done.wait(_FIRST_DELAY):
            return
        while not done.is_set():
            stream.write(f"\r{message} ... {time.perf_counter() - start:.1f}s")
            stream.flush()
            shown[0] = True
            done.wait(_INTERVAL)

    thread = threading.Thread(target=tick, name="jaxpr-cc-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if shown[0]:
            stream.write("\r\x1b[2K")  # erase the progress line
            stream.flush()
