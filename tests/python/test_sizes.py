"""The ctypes structs of python/gma/_lib.py match include/gma.h exactly: the
same fields in the same order as the header declares them (parsed from
gma.h), and the same sizeof and field offsets as the C compiler gives
(printed by tests/python/sizes.c, built by CMake).
Usage: test_sizes.py <gma_py_sizes executable> <include/gma.h>"""
import ctypes
import json
import re
import subprocess
import sys
import unittest

from common import run

from gma import _lib

SIZES_EXE, GMA_H = sys.argv[1], sys.argv[2]


def header_fields(text, typedef):
    """Field names of `typedef struct ... { ... } typedef;` in declaration order."""
    m = re.search(r"typedef struct \w+ \{([^{}]*)\} %s;" % re.escape(typedef), text)
    if not m:
        raise AssertionError("%s not found in gma.h" % typedef)
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        # "uint64_t a", "char trace_path[512]", "const char *tag",
        # "gma_future_callback_t callback"
        for part in decl.split(","):
            nm = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", part.strip())
            names.append(nm.group(1))
    return names


class Layout(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        out = subprocess.run([SIZES_EXE], check=True, capture_output=True, text=True).stdout
        cls.c = json.loads(out)
        with open(GMA_H) as fh:
            cls.header = fh.read()

    def test_every_struct_is_printed(self):
        self.assertEqual(set(self.c), set(_lib.STRUCTS))

    def test_fields_in_header_order(self):
        for name, cls in _lib.STRUCTS.items():
            with self.subTest(struct=name):
                self.assertEqual([f for f, _ in cls._fields_], header_fields(self.header, name))

    def test_sizeof_and_offsets(self):
        for name, cls in _lib.STRUCTS.items():
            with self.subTest(struct=name):
                c = self.c[name]
                self.assertEqual(ctypes.sizeof(cls), c["sizeof"], "sizeof(%s)" % name)
                for field, _ in cls._fields_:
                    self.assertEqual(getattr(cls, field).offset, c["fields"][field],
                                     "offsetof(%s, %s)" % (name, field))

    def test_size_fields_are_set(self):
        for name, cls in _lib.STRUCTS.items():
            if cls._fields_[0][0] == "size":
                self.assertEqual(_lib.new(cls).size, self.c[name]["sizeof"], name)


if __name__ == "__main__":
    run()
