"""The PEP 517 build backend of the gma Python package (pyproject.toml names
it), standard library only, so that `pip install ./python` works offline and
with any pip that reads pyproject.toml: there is nothing to download, even for
an isolated build.

It owns turning python/gma/*.py and pyproject.toml's [project] table into a
wheel (pure Python: py3-none-any) or an sdist. The wheel holds the package's
.py files and its .dist-info (METADATA, WHEEL, RECORD) and nothing else: not
libgma, which comes from the CMake build or install (docs/python.md),
and not this file.
"""
import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "gma"


def _project():
    """pyproject.toml's [project] table: name, version, description,
    requires-python (strings), and optional-dependencies (extra name -> list
    of requirement strings); tomllib when the Python has it, 3.11+."""
    path = os.path.join(HERE, "pyproject.toml")
    try:
        import tomllib
    except ImportError:
        tomllib = None
    if tomllib is not None:
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]
    # Older Pythons: the tables are flat `key = "string"` lines, and
    # `extra = ["requirement", ...]` lines in [project.optional-dependencies].
    with open(path, encoding="utf-8") as f:
        text = f.read()

    def table(name):
        m = re.search(r"^\[%s\]\s*$(.*?)(?=^\[|\Z)" % re.escape(name), text, re.M | re.S)
        return m.group(1) if m else None

    body = table("project")
    if body is None:
        raise RuntimeError("%s has no [project] table" % path)
    p = {k: v for k, v in re.findall(r'^([A-Za-z-]+)\s*=\s*"([^"]*)"\s*$', body, re.M)}
    extras = table("project.optional-dependencies")
    if extras is not None:
        p["optional-dependencies"] = {
            k: re.findall(r'"([^"]*)"', v)
            for k, v in re.findall(r'^([A-Za-z0-9_-]+)\s*=\s*\[(.*?)\]\s*$', extras, re.M)}
    return p


def _files():
    """The package's files: (path inside the wheel, path on disk), sorted."""
    out = []
    pkg = os.path.join(HERE, PACKAGE)
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py"):
            out.append(("%s/%s" % (PACKAGE, name), os.path.join(pkg, name)))
    return out


def _metadata(p):
    lines = ["Metadata-Version: 2.1", "Name: %s" % p["name"], "Version: %s" % p["version"]]
    if p.get("description"):
        lines.append("Summary: %s" % p["description"])
    if p.get("requires-python"):
        lines.append("Requires-Python: %s" % p["requires-python"])
    for extra, reqs in sorted(p.get("optional-dependencies", {}).items()):
        lines.append("Provides-Extra: %s" % extra)
        lines.extend('Requires-Dist: %s; extra == "%s"' % (r, extra) for r in reqs)
    return "\n".join(lines) + "\n"


def _dist(p):
    return "%s-%s" % (re.sub(r"[-_.]+", "_", p["name"]), p["version"])


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def _write_wheel(wheel_directory):
    p = _project()
    dist = _dist(p)
    info = dist + ".dist-info"
    entries = []
    for arc, disk in _files():
        with open(disk, "rb") as f:
            entries.append((arc, f.read()))
    entries.append((info + "/METADATA", _metadata(p).encode("utf-8")))
    entries.append((info + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: gma_build_backend\n"
                                       "Root-Is-Purelib: true\nTag: py3-none-any\n")
                    .encode("utf-8")))
    record = "".join("%s,%s,%d\n" % (arc, _record_hash(data), len(data))
                     for arc, data in entries) + info + "/RECORD,,\n"
    entries.append((info + "/RECORD", record.encode("utf-8")))
    name = dist + "-py3-none-any.whl"
    # A fixed date keeps the wheel the same from build to build.
    stamp = (2020, 1, 1, 0, 0, 0)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries:
            zi = zipfile.ZipInfo(arc, stamp)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return name


# --- PEP 517 hooks ------------------------------------------------------------------
def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory)


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    dist = _dist(p)
    name = dist + ".tar.gz"
    files = [("pyproject.toml", os.path.join(HERE, "pyproject.toml")),
             ("gma_build_backend.py", os.path.join(HERE, "gma_build_backend.py"))] + _files()
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for arc, disk in files:
            t.add(disk, arcname="%s/%s" % (dist, arc))
        data = _metadata(p).encode("utf-8")
        ti = tarfile.TarInfo("%s/PKG-INFO" % dist)
        ti.size, ti.mode, ti.mtime = len(data), 0o644, int(time.time())
        t.addfile(ti, io.BytesIO(data))
    return name
