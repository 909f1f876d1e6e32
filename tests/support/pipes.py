"""Reading a subprocess's text pipes to their end after a test read them in part."""

from __future__ import annotations

import subprocess
import threading


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """Wait for `proc` and return what is left of its stdout and stderr ("" where not piped).

    `communicate(timeout=...)` reads the raw pipes, so after `for line in proc.stderr` it loses
    the lines the text wrapper had read ahead; this reads through the wrappers."""
    texts: dict[str, str] = {}

    def read(name: str, pipe) -> None:
        texts[name] = pipe.read()

    readers = [
        threading.Thread(target=read, args=(name, pipe), daemon=True)
        for name, pipe in (("out", proc.stdout), ("err", proc.stderr))
        if pipe is not None
    ]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    for reader in readers:
        reader.join(timeout=60)
    return texts.get("out", ""), texts.get("err", "")
