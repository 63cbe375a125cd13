#!/usr/bin/env python3
"""`pip install ./python` works offline and the installed package finds libgma
the documented ways: pip builds and installs the package (no index, no
network, build isolation on: the in-tree backend needs nothing) into a
temporary --target directory; then a Python started elsewhere, with only that
directory on its path, imports gma from it and allocates and frees through it
on the simulated device, finding libgma through GMA_LIBRARY, through the
system's library path (LD_LIBRARY_PATH), and next to the package. The
package's version must equal libgma's (include/gma/version.h) and
pyproject.toml's, and its METADATA must state gma.torch's minimum PyTorch
(the "torch" extra). Skips (77) when this Python has no pip.

Usage: test_pip_install.py REPO_ROOT LIBGMA
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

FAILS = []

PROBE = r"""
import os, sys, gma
site = sys.argv[1]
assert os.path.dirname(os.path.dirname(os.path.abspath(gma.__file__))) == site, gma.__file__
with gma.Allocator("device:sim,sim_capacity:64M") as a:
    s = a.stream_create()
    p = a.alloc(1 << 20, stream=s)
    q = a.alloc(3000)
    got = a.stats()["allocated"]["current"]
    assert got >= (1 << 20) + 3000, got
    a.free(q)
    a.free(p)
    a.stream_destroy(s)
print("ok", gma.__version__, gma.version(), gma.library_path())
"""


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("  FAIL: " + what)
    return cond


def probe(site, cwd, env_extra, what):
    env = {k: v for k, v in os.environ.items()
           if k not in ("GMA_LIBRARY", "PYTHONPATH", "LD_LIBRARY_PATH", "GMA_CONF")}
    env["PYTHONPATH"] = site
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(env_extra)
    p = subprocess.run([sys.executable, "-c", PROBE, site], cwd=cwd, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=60)
    out = p.stdout.strip()
    print("  %s: %s" % (what, out.splitlines()[-1] if out else "(no output)"))
    check(p.returncode == 0 and out.splitlines()[-1].startswith("ok "),
          "%s: exit %d:\n%s" % (what, p.returncode, out))
    return out.splitlines()[-1].split() if out else []


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: test_pip_install.py REPO_ROOT LIBGMA\n")
        return 2
    repo, libgma = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True)
    if pip.returncode != 0:
        print("SKIPPED: %s has no pip (%s)" % (sys.executable, pip.stdout.strip()))
        return 77
    print(pip.stdout.strip())

    with open(os.path.join(repo, "include", "gma", "version.h")) as f:
        c_version = re.search(r'#define GMA_VERSION_STRING "([^"]+)"', f.read()).group(1)
    with open(os.path.join(repo, "python", "pyproject.toml")) as f:
        py_version = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    check(py_version == c_version, "pyproject.toml says %s, version.h %s" % (py_version, c_version))

    with tempfile.TemporaryDirectory(prefix="gma-pip-") as tmp:
        site = os.path.join(tmp, "site")
        before = sorted(os.listdir(os.path.join(repo, "python")))
        cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
               "--no-cache-dir", "--disable-pip-version-check", "--target", site,
               os.path.join(repo, "python")]
        print("  " + " ".join(cmd))
        env = dict(os.environ, PIP_NO_INPUT="1")
        p = subprocess.run(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
        if not check(p.returncode == 0, "pip install exited %d:\n%s" % (p.returncode, p.stdout)):
            return 1
        installed = sorted(os.listdir(site))
        check(installed == ["gma", "gma-%s.dist-info" % py_version],
              "installed %r" % installed)
        # The "torch" extra states gma.torch's minimum PyTorch (MIN_TORCH).
        with open(os.path.join(repo, "python", "gma", "torch.py")) as f:
            m = re.search(r"^MIN_TORCH = \((\d+), (\d+)\)", f.read(), re.M)
        want = 'Requires-Dist: torch>=%s.%s; extra == "torch"' % m.groups() if m else None
        meta = os.path.join(site, "gma-%s.dist-info" % py_version, "METADATA")
        text = open(meta).read() if os.path.exists(meta) else ""
        check(want is not None and want in text.splitlines()
              and "Provides-Extra: torch" in text.splitlines(),
              "METADATA lacks %r (gma.torch.MIN_TORCH) or Provides-Extra: torch:\n%s"
              % (want, text))
        check(sorted(f for f in os.listdir(os.path.join(site, "gma")) if f.endswith(".py"))
              == sorted(f for f in os.listdir(os.path.join(repo, "python", "gma"))
                        if f.endswith(".py")),
              "the installed package's files differ from python/gma's")
        # Building must leave nothing behind in the source tree (a build/ or
        # *.egg-info directory would be a setuptools habit).
        after = sorted(f for f in os.listdir(os.path.join(repo, "python")) if f != "__pycache__")
        check(after == [f for f in before if f != "__pycache__"],
              "python/ was %r, is %r after the build" % (before, after))

        print("the installed package, from %s:" % tmp)
        got = probe(site, tmp, {"GMA_LIBRARY": libgma}, "GMA_LIBRARY")
        if len(got) == 4:
            check(got[1] == py_version and got[2] == c_version and got[3] == libgma,
                  "GMA_LIBRARY: version %s, libgma %s at %s" % tuple(got[1:]))
        got = probe(site, tmp, {"LD_LIBRARY_PATH": os.path.dirname(libgma)},
                    "system library path (LD_LIBRARY_PATH)")
        if len(got) == 4:
            check(os.path.basename(got[3]).startswith("libgma.so"),
                  "LD_LIBRARY_PATH: loaded %s" % got[3])
        beside = os.path.join(site, "gma", "libgma.so")
        shutil.copy2(libgma, beside)
        got = probe(site, tmp, {}, "next to the package")
        if len(got) == 4:
            check(got[3] == beside, "next to the package: loaded %s, not %s" % (got[3], beside))

    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
