"""Progress of long work and the library's messages, one style everywhere (tqdm + logging).

``Progress`` (training, evaluation, data decoding, analysis, conversion, the demo): on a terminal
a tqdm bar on stderr, redrawn at least every second even while one step runs (elapsed time, ETA,
rate, and the caller's numbers such as loss and accuracy); anywhere else (a log file, a pipe) plain
``logging`` lines of the same text, at most one per ``line_every_s`` seconds, plus the last
(unless all of it took under QUIET_S).

Library modules log through ``logging.getLogger(__name__)`` (children of ``attnconv``) and never
print; ``configure_logging`` (called by the CLI) sends those messages to stderr without breaking
a bar. Without it (attnconv used as a library) INFO messages and lines stay silent, as Python's
logging does by default; bars still show on a terminal unless the ``attnconv`` logger is set
above INFO (``attnconv --quiet``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")
ROOT_LOGGER = "attnconv"
# the bar (terminal) and the line (logs) show the same fields
BAR_FORMAT = (
    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}"
    "{postfix}]"
)
LINE_FORMAT = (
    "{desc}: {n_fmt}/{total_fmt} [{elapsed} elapsed, ETA {remaining}, {rate_fmt}{postfix}]"
)
REFRESH_S = 0.5  # a terminal bar is redrawn at least this often
QUIET_S = 2.0  # in the logs, work done in less time than this gets no closing line


class _TqdmHandler(logging.Handler):
    """Writes records to the current ``sys.stderr`` through ``tqdm.write`` (above any bar)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging's own contract: report, never raise
            self.handleError(record)


def configure_logging(verbosity: int = 0) -> None:
    """The CLI's logging: attnconv's messages on stderr as plain text; ``verbosity`` -1 (quiet:
    warnings and errors only, no bars), 0 (info, the default), 1 (debug)."""
    log = logging.getLogger(ROOT_LOGGER)
    level = {-1: logging.WARNING, 0: logging.INFO}.get(verbosity, logging.DEBUG)
    log.setLevel(level)
    for h in [h for h in log.handlers if isinstance(h, _TqdmHandler)]:
        log.removeHandler(h)
    handler = _TqdmHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.propagate = False


def bars_enabled() -> bool:
    """False when the ``attnconv`` logger is set above INFO (``--quiet``), and on every process
    of a ``torchrun`` job but rank 0 (one display, not one per process)."""
    level = logging.getLogger(ROOT_LOGGER).level
    quiet = level != logging.NOTSET and level > logging.INFO
    return not quiet and os.environ.get("RANK", "0") == "0"


def _is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False


def _terminal_size() -> tuple[int, int]:
    """stderr's terminal size; (100, 24) where the terminal does not say (a size of 0 would hide
    tqdm's bar entirely)."""
    try:
        cols, rows = os.get_terminal_size(sys.stderr.fileno())
    except (AttributeError, ValueError, OSError):
        cols = rows = 0
    return (cols if cols > 0 else 100), (rows if rows > 0 else 24)


def _fmt_postfix(values: dict[str, object]) -> str:
    return "".join(f", {k} {v}" for k, v in values.items())


def _redraw(ref: weakref.ref, stop: threading.Event) -> None:
    """Redraw a bar while a long step runs (tqdm itself redraws only on update); ends with the
    bar (closed, or garbage-collected unclosed)."""
    while not stop.wait(REFRESH_S):
        p = ref()
        if p is None:
            return
        bar = p.bar
        if bar is not None and not bar.disable:
            bar.refresh()
        del p, bar


class Progress:
    """Progress of ``total`` units of work (None: unknown). ``update(n, **numbers)`` after each
    unit; ``numbers`` (already formatted, e.g. ``loss="2.103"``) are shown after the rate.
    ``leave=False``: the bar disappears when done (a terminal only)."""

    def __init__(
        self,
        total: int | None,
        desc: str,
        *,
        unit: str = "it",
        initial: int = 0,
        logger: logging.Logger | None = None,
        line_every_s: float = 5.0,
        leave: bool = True,
        enabled: bool = True,
    ):
        self.total, self.desc, self.unit, self.initial = total, desc, unit, initial
        self.n, self.postfix = initial, {}
        self.log = logger or logging.getLogger(ROOT_LOGGER)
        self.line_every_s = line_every_s
        self.enabled = enabled and bars_enabled()
        self.t0 = self.last_line = time.time()
        self.lines = 0
        self.bar: tqdm | None = None
        self._stop = threading.Event()
        if self.enabled and _is_tty():
            cols, rows = _terminal_size()
            self.bar = tqdm(
                total=total,
                desc=desc,
                unit=unit,
                initial=initial,
                file=sys.stderr,
                ncols=cols,
                nrows=rows,
                mininterval=0.1,
                bar_format=BAR_FORMAT,
                leave=leave,
            )
            threading.Thread(
                target=_redraw, args=(weakref.ref(self), self._stop), daemon=True
            ).start()

    def line(self) -> str:
        """The current state as one line of text (what the logs get)."""
        return tqdm.format_meter(
            self.n,
            self.total,
            time.time() - self.t0,
            prefix=self.desc,
            unit=self.unit,
            bar_format=LINE_FORMAT,
            initial=self.initial,
            postfix=_fmt_postfix(self.postfix)[2:] or None,
        )

    def update(self, n: int = 1, **numbers: object) -> None:
        self.n += n
        self.postfix.update(numbers)
        if not self.enabled:
            return
        if self.bar is not None:
            if numbers:
                self.bar.set_postfix_str(_fmt_postfix(self.postfix)[2:], refresh=False)
            self.bar.update(n)
        elif time.time() - self.last_line >= self.line_every_s:
            self.log.info(self.line())
            self.last_line, self.lines = time.time(), self.lines + 1

    def close(self) -> None:
        """End the bar (a last line in the logs)."""
        self._stop.set()
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.lines or time.time() - self.t0 >= QUIET_S:
            self.log.info(self.line())
        self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def track(
    items: Iterable[T], desc: str, *, total: int | None = None, unit: str = "it", **kw
) -> Iterator[T]:
    """``items`` with a Progress over them (``total`` defaults to ``len(items)``)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(total, desc, unit=unit, **kw) as p:
        for item in items:
            yield item
            p.update(1)
