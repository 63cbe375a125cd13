#!/usr/bin/env python3
"""tools/layers.py can fail: on a copy of runtime/ with planted violations (an
upward call from base/ to api/, a loop of calls between core/ and cache/, a
function of 81 lines, a .c file of 801 lines) it must exit 1 and name each;
on the untouched copy it must pass. Usage: test_layers_planted.py ROOT"""
import os
import shutil
import subprocess
import sys
import tempfile


def run(root):
    r = subprocess.run([sys.executable, os.path.join(root, "tools", "layers.py"), "--root", root],
                       capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main():
    src = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(src, "runtime"), os.path.join(tmp, "runtime"))
        shutil.copytree(os.path.join(src, "tools"), os.path.join(tmp, "tools"),
                        ignore=shutil.ignore_patterns("__pycache__", "replay"))
        rc, out = run(tmp)
        if rc != 0:
            print("FAIL: the untouched copy does not pass:\n" + out)
            return 1
        with open(os.path.join(tmp, "runtime", "base", "error.c"), "a") as f:
            f.write("\nvoid gma__planted_up(void) { gma_create(NULL, NULL); }\n")
        with open(os.path.join(tmp, "runtime", "cache", "stream_cache.c"), "a") as f:
            f.write("\nvoid gma__planted_cache(void) { gma__planted_core(); }\n")
        with open(os.path.join(tmp, "runtime", "core", "validate.c"), "a") as f:
            f.write("\nvoid gma__planted_core(void) { gma__planted_cache(); }\n")
            f.write("\nvoid gma__planted_long(void) {\n" + "  (void)0;\n" * 79 + "}\n")
        with open(os.path.join(tmp, "runtime", "base", "config.c"), "a") as f:
            f.write("\n" * 801)
        rc, out = run(tmp)
        want = ["call up: runtime/base/error.c gma__planted_up() -> runtime/api/api.c gma_create()",
                "call up: runtime/core/validate.c gma__planted_core() -> runtime/cache/stream_cache.c",
                "loop across folders:",
                "function of 81 lines (> 80): runtime/core/validate.c",
                "file of ",
                "runtime/base/config.c"]
        missing = [w for w in want if w not in out]
        if rc != 1 or missing:
            print("FAIL: rc %d, missing %s in:\n%s" % (rc, missing, out))
            return 1
    print("ok: layers.py fails on each planted violation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
