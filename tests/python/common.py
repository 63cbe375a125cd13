"""Shared by the Python tests: importing gma from the source tree, skipping
(CTest's skip code 77) with a printed reason, running a unittest module, and
capturing what C code writes to stderr (file descriptor 2)."""
import contextlib
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))

MiB = 1 << 20
KiB = 1 << 10


def skip(reason):
    print("SKIPPED: %s" % reason)
    sys.exit(77)


def run(argv_used=2):
    """unittest.main on the caller's module; the command line's own
    arguments (the sizes helper, gma.h) are not unittest's."""
    del sys.argv[1:1 + argv_used]
    prog = unittest.main(module="__main__", exit=False, verbosity=2)
    sys.exit(0 if prog.result.wasSuccessful() else 1)


@contextlib.contextmanager
def c_stderr():
    """Collects what is written to fd 2 (C's stderr) inside the block; the
    text is in the yielded list's first element afterwards."""
    out = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.append(tmp.read().decode("utf-8", "replace"))


def round512(n):
    return (n + 511) // 512 * 512
