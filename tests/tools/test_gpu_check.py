#!/usr/bin/env python3
"""Tests that tools/gpu_check.sh and bench/gpu/torch_train.py skip cleanly
where there is no GPU, as on CI.

  test_gpu_check.py gpu_check REPO    tools/gpu_check.sh: with the driver and
      nvidia-smi pointed at missing files (NVIDIA_SMI, GMA_CUDA_DRIVER), and
      with this machine's own (unless it has a GPU), it must exit 0 within
      10 s printing exactly "gpu_check: no GPU (<why>): nothing to check", and
      create neither its build directory nor its results file (both pointed
      into a temporary directory; the repository's build/gpu and
      docs/gpu/RESULTS.md must not appear either). A fake nvidia-smi that
      lists a GPU the driver cannot open must make it fail (exit 1), and one
      that lists none must give the "lists no GPU" reason.
  test_gpu_check.py fake REPO   tools/gpu_check.sh end to end on the fake CUDA
      driver (GPU_CHECK_FAKE=1): within 180 s it must build, run the probe
      and the GPU tests on the fake (each step "ok"), record the GPU-only
      steps (bench, torch_bench, torch_train) as skipped saying why, exit 0,
      and write RESULTS.md (into a temporary directory) naming the fake.
  test_gpu_check.py torch_train REPO  bench/gpu/torch_train.py: with a stand-in
      torch that does not import, and one that sees no CUDA device, it must
      exit 0 printing "torch_train: skipped: <why>" and write
      {"skipped": why} to its JSON file; with this machine's own Python too
      (unless torch sees a CUDA device here).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

LIMIT_S = 10
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
    return cond


def run(cmd, env, what):
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=60)
    took = time.monotonic() - t0
    print("%s: exit %d in %.1fs\n  stdout: %r\n  stderr: %r" % (what, r.returncode, took,
                                                             r.stdout, r.stderr[-500:]))
    check(took < LIMIT_S, "%s: took %.1fs (limit %ds)" % (what, took, LIMIT_S))
    return r


def host_has_gpu():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             universal_newlines=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(re.search(r"^GPU \d", out, re.M))


def test_gpu_check(repo, tmp):
    script = os.path.join(repo, "tools", "gpu_check.sh")
    repo_build = os.path.join(repo, "build", "gpu")
    repo_results = os.path.join(repo, "docs", "gpu", "RESULTS.md")
    had = (os.path.exists(repo_build), os.path.exists(repo_results))
    build = os.path.join(tmp, "build-gpu")
    results = os.path.join(tmp, "docs", "RESULTS.md")
    base = dict(os.environ, GPU_CHECK_BUILD_DIR=build, GPU_CHECK_RESULTS=results)
    missing_smi = os.path.join(tmp, "none", "nvidia-smi")
    missing_drv = os.path.join(tmp, "none", "libcuda.so.1")

    def nothing_made(what):
        check(not os.path.exists(build), "%s: created %s" % (what, build))
        check(not os.path.exists(os.path.dirname(results)), "%s: created %s" % (what, results))
        check(had[0] or not os.path.exists(repo_build), "%s: created %s" % (what, repo_build))
        check(had[1] or not os.path.exists(repo_results), "%s: created %s" % (what, repo_results))

    # 1. No nvidia-smi, no driver: the exact skip line.
    env = dict(base, NVIDIA_SMI=missing_smi, GMA_CUDA_DRIVER=missing_drv)
    r = run(["bash", script], env, "gpu_check, no nvidia-smi and no driver")
    want = re.compile(r"gpu_check: no GPU \(%s not found; %s does not load \(.+\)\): "
                      r"nothing to check\n\Z" % (re.escape(missing_smi), re.escape(missing_drv)))
    check(r.returncode == 0, "gpu_check without a GPU: exit %d, want 0" % r.returncode)
    check(want.match(r.stdout), "gpu_check without a GPU: stdout %r does not match %r"
          % (r.stdout, want.pattern))
    nothing_made("no nvidia-smi and no driver")

    # 2. A fake nvidia-smi that lists no GPU.
    empty_smi = os.path.join(tmp, "smi-empty")
    with open(empty_smi, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(empty_smi, 0o755)
    env = dict(base, NVIDIA_SMI=empty_smi, GMA_CUDA_DRIVER=missing_drv)
    r = run(["bash", script], env, "gpu_check, nvidia-smi lists no GPU")
    check(r.returncode == 0, "nvidia-smi lists no GPU: exit %d, want 0" % r.returncode)
    check(r.stdout.startswith("gpu_check: no GPU (%s -L lists no GPU; " % empty_smi)
          and r.stdout.endswith("): nothing to check\n"),
          "nvidia-smi lists no GPU: stdout %r" % r.stdout)
    nothing_made("nvidia-smi lists no GPU")

    # 3. nvidia-smi lists a GPU the driver cannot open: a broken machine, exit 1.
    fake_smi = os.path.join(tmp, "smi-one")
    with open(fake_smi, "w") as f:
        f.write("#!/bin/sh\necho 'GPU 0: Fake GPU (UUID: GPU-00000000)'\n")
    os.chmod(fake_smi, 0o755)
    env = dict(base, NVIDIA_SMI=fake_smi, GMA_CUDA_DRIVER=missing_drv)
    r = run(["bash", script], env, "gpu_check, a GPU the driver cannot open")
    check(r.returncode == 1, "a GPU the driver cannot open: exit %d, want 1" % r.returncode)
    check("lists 1 GPU(s), but the CUDA driver is not usable" in r.stdout
          and "gma could not use the GPU" in r.stdout,
          "a GPU the driver cannot open: stdout %r" % r.stdout)
    nothing_made("a GPU the driver cannot open")

    # 4. This machine as it is (CI has no GPU).
    if host_has_gpu():
        print("gpu_check on this machine: not run, nvidia-smi lists a GPU here")
        return
    env = dict(base)
    env.pop("NVIDIA_SMI", None)
    env.pop("GMA_CUDA_DRIVER", None)
    r = run(["bash", script], env, "gpu_check on this machine")
    check(r.returncode == 0, "gpu_check on this machine: exit %d, want 0" % r.returncode)
    check(re.match(r"gpu_check: no GPU \(.+\): nothing to check\n\Z", r.stdout),
          "gpu_check on this machine: stdout %r" % r.stdout)
    nothing_made("this machine")


FAKE_LIMIT_S = 180


def test_fake(repo, tmp):
    script = os.path.join(repo, "tools", "gpu_check.sh")
    build = os.path.join(tmp, "build-gpu")
    out = os.path.join(tmp, "out")
    results = os.path.join(tmp, "docs", "RESULTS.md")
    env = dict(os.environ, GPU_CHECK_FAKE="1", GPU_CHECK_BUILD_DIR=build, GPU_CHECK_OUT=out,
               GPU_CHECK_RESULTS=results)
    env.pop("GMA_CUDA_DRIVER", None)
    t0 = time.monotonic()
    r = subprocess.run(["bash", script], env=env, cwd=repo, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True,
                       timeout=FAKE_LIMIT_S + 60)
    took = time.monotonic() - t0
    steps = dict(re.findall(r"^gpu_check: \[([^\]]+)\] (ok|failed|skipped) in ", r.stdout, re.M))
    print("gpu_check on the fake driver: exit %d in %.0fs; steps %s" % (r.returncode, took, steps))
    if r.returncode != 0:
        print(r.stdout[-4000:])
    check(r.returncode == 0, "fake: exit %d, want 0" % r.returncode)
    check(took < FAKE_LIMIT_S, "fake: took %.0fs (limit %ds)" % (took, FAKE_LIMIT_S))
    for step in ("build", "probe", "ctest -L gpu"):
        check(steps.get(step) == "ok", "fake: step %s is %s, want ok" % (step, steps.get(step)))
    for step in ("bench", "torch_bench", "torch_train"):
        check(steps.get(step) == "skipped", "fake: step %s is %s, want skipped" % (step, steps.get(step)))
    check(len(re.findall(r"skipped in 0s: GPU-only step", r.stdout)) == 3,
          "fake: the GPU-only steps do not say why they were skipped")
    check(os.path.isfile(results), "fake: no %s" % results)
    if os.path.isfile(results):
        text = open(results).read()
        check("fake CUDA" in text and "| probe | ok |" in text,
              "fake: RESULTS.md does not name the fake driver or the probe's result")


STUB_NO_IMPORT = "raise ImportError('stub: no torch here')\n"
STUB_NO_CUDA = ("__version__ = '0.0-stub'\n"
                "class cuda:\n"
                "    @staticmethod\n"
                "    def is_available():\n"
                "        return False\n")


def test_torch_train(repo, tmp):
    script = os.path.join(repo, "bench", "gpu", "torch_train.py")

    def case(what, stub, want):
        env = dict(os.environ)
        if stub is not None:
            d = os.path.join(tmp, what.replace(" ", "_"), "torch")
            os.makedirs(d)
            with open(os.path.join(d, "__init__.py"), "w") as f:
                f.write(stub)
            env["PYTHONPATH"] = os.pathsep.join(
                [os.path.dirname(d)] + [p for p in [env.get("PYTHONPATH")] if p])
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        out = os.path.join(tmp, what.replace(" ", "_") + ".json")
        r = run([sys.executable, script, "--json", out], env, "torch_train, " + what)
        check(r.returncode == 0, "torch_train, %s: exit %d, want 0" % (what, r.returncode))
        lines = r.stdout.splitlines()
        check(len(lines) == 1 and re.match(want, lines[0]),
              "torch_train, %s: stdout %r does not match %r" % (what, r.stdout, want))
        try:
            with open(out) as f:
                data = json.load(f)
            check(data.get("benchmark") == "torch-train" and data.get("skipped")
                  and lines and lines[0] == "torch_train: skipped: " + data["skipped"],
                  "torch_train, %s: JSON %r" % (what, data))
        except (OSError, ValueError) as e:
            check(False, "torch_train, %s: no JSON (%s)" % (what, e))

    case("torch does not import", STUB_NO_IMPORT,
         r"torch_train: skipped: PyTorch is not installed \(import torch: stub: no torch here\)\Z")
    case("torch without CUDA", STUB_NO_CUDA,
         r"torch_train: skipped: torch 0\.0-stub sees no CUDA device "
         r"\(torch\.cuda\.is_available\(\) is False\)\Z")
    probe = subprocess.run([sys.executable, "-c", "import torch, sys; "
                            "sys.exit(0 if torch.cuda.is_available() else 1)"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if probe.returncode == 0:
        print("torch_train with this machine's torch: not run, torch sees a CUDA device here")
    else:
        case("this machine", None, r"torch_train: skipped: .+\Z")


def main():
    mode, repo = sys.argv[1], os.path.abspath(sys.argv[2])
    tmp = tempfile.mkdtemp(prefix="test_gpu_check_")
    try:
        {"gpu_check": test_gpu_check, "fake": test_fake, "torch_train": test_torch_train}[mode](repo, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for f in fails:
        print("FAIL", f)
    print("test_gpu_check %s: %s" % (mode, "FAILED" if fails else "ok"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
