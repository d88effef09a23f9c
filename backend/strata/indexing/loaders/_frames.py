"""Length-prefixed frames over a pipe: what the parse pool (``_isolated``) and its workers (``_worker``) say.

A frame is its length (8 bytes, little-endian) and its bytes. The worker reads and writes blocking, one
request at a time; the pool's side (``FrameChannel``) never blocks for longer than a tick, so that a
deadline or a stop event is seen while a frame is on its way.
"""

from __future__ import annotations

import os
import select
import struct
import threading
import time
from collections.abc import Sequence

from strata.errors import IndexingStoppedError

HEADER = struct.Struct("<Q")
_CHUNK = 1024 * 1024  # bytes moved per write: a pipe takes 64 KiB at a time anyway
TICK_S = 0.1  # how soon a set stop event or a passed deadline is seen


# The deadline passing before a frame went whole is a built-in ``TimeoutError``; the stop event set while a
# frame was on its way is ``IndexingStoppedError``, the error a stopped run raises anywhere else.
STOPPED = "indexing stopped while parsing this file: the service is shutting down"


def write_frames(fd: int, frames: Sequence[bytes]) -> None:
    """Writes each frame to ``fd`` (blocking); ``BrokenPipeError`` when the reader is gone."""
    for frame in frames:
        _write_all(fd, HEADER.pack(len(frame)))
        _write_all(fd, frame)


def read_frame(fd: int) -> bytes | None:
    """The next frame from ``fd`` (blocking); None at end of file before a frame starts."""
    header = _read_exactly(fd, HEADER.size)
    if header is None:
        return None
    body = _read_exactly(fd, HEADER.unpack(header)[0])
    if body is None:
        raise EOFError("the pipe ended inside a frame")
    return body


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:_CHUNK]) :]


def _read_exactly(fd: int, size: int) -> bytes | None:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        read = os.readv(fd, [view[got:]])
        if read == 0:
            if got:
                raise EOFError("the pipe ended inside a frame")
            return None
        got += read
    return bytes(buffer)


class FrameChannel:
    """The pool's end of one worker's two pipes (non-blocking), each transfer bounded by a deadline and a stop."""

    def __init__(self, to_worker: int, from_worker: int) -> None:
        os.set_blocking(to_worker, False)
        os.set_blocking(from_worker, False)
        self._out, self._in = to_worker, from_worker

    def close(self) -> None:
        """Closes both pipes, once: a descriptor closed twice may by then be another thread's file."""
        fds, (self._out, self._in) = (self._out, self._in), (-1, -1)
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    def send(self, frames: Sequence[bytes], deadline: float, stop: threading.Event | None) -> None:
        """Writes ``frames``; ``BrokenPipeError`` when the worker is gone, ``TimeoutError``, ``IndexingStoppedError``."""
        for frame in frames:
            for part in (HEADER.pack(len(frame)), frame):
                view = memoryview(part)
                while view:
                    self._wait(self._out, writable=True, deadline=deadline, stop=stop)
                    try:
                        view = view[os.write(self._out, view[:_CHUNK]) :]
                    except BlockingIOError:
                        continue

    def receive(self, deadline: float, stop: threading.Event | None) -> bytes:
        """The next frame; ``EOFError`` when the worker closed its end (it died), ``TimeoutError``,
        ``IndexingStoppedError``."""
        header = self._receive_exactly(HEADER.size, deadline, stop)
        return self._receive_exactly(HEADER.unpack(header)[0], deadline, stop)

    def _receive_exactly(self, size: int, deadline: float, stop: threading.Event | None) -> bytes:
        buffer = bytearray(size)
        view, got = memoryview(buffer), 0
        while got < size:
            self._wait(self._in, writable=False, deadline=deadline, stop=stop)
            try:
                read = os.readv(self._in, [view[got:]])
            except BlockingIOError:
                continue
            if read == 0:
                raise EOFError("the worker closed its pipe")
            got += read
        return bytes(buffer)

    @staticmethod
    def _wait(fd: int, *, writable: bool, deadline: float, stop: threading.Event | None) -> None:
        """Returns once ``fd`` is ready (or at end of file / a closed reader, which the next call reports)."""
        while True:
            if stop is not None and stop.is_set():
                raise IndexingStoppedError(STOPPED)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the frame did not pass before its deadline")
            # poll, not select: a service's descriptors go past select's 1,024
            poller = select.poll()
            poller.register(fd, select.POLLOUT if writable else select.POLLIN)
            if poller.poll(min(left, TICK_S) * 1000):
                return  # ready, or an error or hang-up that the read or write then reports
