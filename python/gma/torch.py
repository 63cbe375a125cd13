"""gma under PyTorch, through libgma_torch.so (plugins/torch).

    import gma.torch
    gma.torch.use()                 # before the first CUDA tensor
    x = torch.empty(1 << 20, device="cuda")
    print(gma.torch.summary())

use() is the three lines

    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        path, "gma_torch_shim_alloc", "gma_torch_shim_free")
    torch.cuda.memory.change_current_allocator(alloc)

with path the C++ shim libgma_torch_shim.so (built where CMake finds torch),
whose allocation raises torch.OutOfMemoryError when gma has no memory for a
tensor. Without the shim, use() warns and installs libgma_torch.so's
gma_torch_alloc, which returns NULL on failure (PyTorch then makes a tensor
at address 0).

The plug-in makes one gma allocator per device on first use, configured by
GMA_CONF (device_id is the device PyTorch asks for). PyTorch's
memory_stats(), empty_cache() and Tensor.record_stream() do not reach a
plug-in loaded from Python: use stats(), summary(), empty_cache() and
record_stream() here instead. iteration_mark() marks the end of a training
step for planned memory (plan:on in GMA_CONF; a no-op under plan:off).

CUDA graphs: torch.cuda.graph's private pools do not reach a plug-in. Capture
with gma.torch.graph instead (a drop-in for torch.cuda.graph), so that the
capture's allocations come from a gma graph pool and stay the graph's:

    g = torch.cuda.CUDAGraph()
    with gma.torch.graph(g) as cap:       # cap.pool: the gma graph pool
        y = model(x)
    g.replay()
    ... del g; cap.pool.release()

Several graphs share one pool with gma.torch.graph(g2, pool=cap.pool)
(launch them in capture order). A capture begun without it makes gma refuse
the capture's allocations that reach its pool (gma.InvalidArgument).

torch is imported only inside use(), graph and record_stream(); everything
else works through ctypes alone. use() needs PyTorch 2.0 or later (MIN_TORCH):
torch.cuda.memory.CUDAPluggableAllocator and change_current_allocator came in
2.0, and an older torch gets a RuntimeError saying so.
"""
import ctypes
import os
import threading
import warnings

from . import _lib
from . import Allocator, InvalidArgument, _error, _text, _to_dict

ALLOC_FN = "gma_torch_alloc"
FREE_FN = "gma_torch_free"
SHIM_ALLOC_FN = "gma_torch_shim_alloc"
SHIM_FREE_FN = "gma_torch_shim_free"

# The oldest PyTorch use() works with: torch.cuda.memory.CUDAPluggableAllocator
# and change_current_allocator came in 2.0 (so did Tensor.untyped_storage,
# which record_stream reads). python/pyproject.toml's "torch" extra says the
# same (tests/python/test_pip_install.py checks).
MIN_TORCH = (2, 0)
_TORCH_NEEDS = ("CUDAPluggableAllocator", "change_current_allocator")

_lock = threading.Lock()
_plugin = None


def library_path():
    """The path of libgma_torch.so: $GMA_TORCH_LIBRARY, else beside the libgma
    this process loaded (the build writes both into the build directory;
    cmake --install puts both in PREFIX/lib), else the places
    gma._lib.find_library looks, else the system's library path."""
    p = os.environ.get("GMA_TORCH_LIBRARY")
    if p:
        return p
    try:
        libgma = _lib.load().file
    except OSError:
        libgma = None
    if libgma and os.path.isabs(libgma):
        d = os.path.dirname(libgma)
        for c in (os.path.join(d, "libgma_torch.so"),
                  os.path.join(d, "plugins", "torch", "libgma_torch.so")):
            if os.path.exists(c):
                return c
    p = _lib.find_library("gma_torch", env="GMA_TORCH_LIBRARY")
    if not p:
        raise OSError("libgma_torch.so not found: set GMA_TORCH_LIBRARY, or build it "
                      "(CMake target gma_torch)")
    return p


_PROTOS = {
    "gma_torch_alloc": (ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    "gma_torch_free": (None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    "gma_torch_last_error": (ctypes.c_char_p, []),
    "gma_torch_allocator": (ctypes.c_void_p, [ctypes.c_int]),
    "gma_torch_stats": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(_lib.Stats)]),
    "gma_torch_summary": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]),
    "gma_torch_snapshot": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p]),
    "gma_torch_snapshot_write": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]),
    "gma_torch_empty_cache": (ctypes.c_int, [ctypes.c_int]),
    "gma_torch_iteration_mark": (ctypes.c_int, [ctypes.c_int]),
    "gma_torch_record_stream": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]),
    "gma_torch_shutdown": (None, []),
    "gma_torch_set_oom_observer": (ctypes.c_int, [ctypes.c_void_p]),
}

# gma_torch_oom_fn: (device, requested, allocated, device_free) -> retry?
_OOM_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                           ctypes.c_uint64)
_oom_observers = []
_oom_fn = None  # the ctypes callback the plug-in holds; kept alive here


def plugin():
    """The loaded libgma_torch.so (a ctypes.CDLL with prototypes set). libgma
    is loaded first, so the plug-in and this package share one copy."""
    global _plugin
    with _lock:
        if _plugin is None:
            _lib.load()
            lib = ctypes.CDLL(library_path())
            for name, (res, args) in _PROTOS.items():
                f = getattr(lib, name)
                f.restype, f.argtypes = res, args
            _plugin = lib
        return _plugin


def last_error():
    """The plug-in's message for the calling thread's last failing call."""
    return _text(plugin().gma_torch_last_error())


def _check(st, function):
    if st != 0:
        raise _error(st, function, last_error())


def shim_path():
    """The path of libgma_torch_shim.so, the plug-in whose allocation raises
    torch.OutOfMemoryError: $GMA_TORCH_SHIM_LIBRARY, else beside
    libgma_torch.so; None where there is none (CMake builds it only where
    its python3 imports torch)."""
    p = os.environ.get("GMA_TORCH_SHIM_LIBRARY")
    if p:
        return p
    c = os.path.join(os.path.dirname(os.path.abspath(library_path())), "libgma_torch_shim.so")
    return c if os.path.exists(c) else None


def entry_points():
    """(path, alloc_fn, free_fn) for CUDAPluggableAllocator: the shim's when
    it loads, else libgma_torch.so's with a warning (an OOM then gives
    PyTorch NULL instead of raising). Loads libgma and libgma_torch.so first,
    so the shim (which links libgma_torch.so) shares their allocators. Call
    after importing torch: the shim needs torch's libc10. A shim named by
    $GMA_TORCH_SHIM_LIBRARY that does not load raises OSError."""
    path = plugin()._name
    shim = shim_path()
    why = "libgma_torch_shim.so is not beside %s (built only where CMake's python3 " \
          "imports torch)" % path
    if shim:
        try:
            ctypes.CDLL(shim)
            return shim, SHIM_ALLOC_FN, SHIM_FREE_FN
        except OSError as e:
            if os.environ.get("GMA_TORCH_SHIM_LIBRARY"):
                raise
            why = "%s does not load (%s); rebuild it against this torch" % (shim, e)
    warnings.warn("gma.torch: %s: an allocation gma cannot satisfy gives PyTorch a NULL "
                  "pointer (a tensor at address 0) instead of raising "
                  "torch.OutOfMemoryError" % why, RuntimeWarning, stacklevel=3)
    return path, ALLOC_FN, FREE_FN


def check_torch(torch):
    """Raises RuntimeError, naming the torch found and what to do, when torch
    lacks the pluggable-allocator interface use() installs gma through
    (PyTorch before 2.0). Asks for the functions themselves rather than
    comparing version strings, so a build that has them passes whatever it
    calls itself."""
    memory = getattr(getattr(torch, "cuda", None), "memory", None)
    missing = [n for n in _TORCH_NEEDS if not hasattr(memory, n)]
    if not missing:
        return
    version = getattr(torch, "__version__", None)
    where = getattr(torch, "__file__", None)
    found = "torch %s" % version if version else "a torch that gives no __version__"
    if where:
        found += " (%s)" % os.path.dirname(os.path.abspath(where))
    need = ".".join(str(v) for v in MIN_TORCH)
    raise RuntimeError(
        "gma.torch needs PyTorch %s or later, and this is %s: it has no "
        "torch.cuda.memory.%s, the pluggable-allocator interface gma.torch.use() "
        "installs gma through. Install PyTorch %s or later in this Python "
        "(pip install 'torch>=%s'), or use gma without PyTorch through gma.Allocator "
        "or the C API" % (need, found, " or ".join(missing), need, need))


def use(conf=None):
    """Makes gma PyTorch's CUDA allocator (before any CUDA tensor exists).
    conf, if given, becomes GMA_CONF for the plug-in's allocators. Returns
    the CUDAPluggableAllocator. An allocation gma cannot satisfy raises
    torch.OutOfMemoryError with gma's message (libgma_torch_shim.so; see
    entry_points for when it is missing). A torch older than MIN_TORCH
    raises RuntimeError (check_torch) before anything is loaded or set."""
    import torch  # only here: the rest of gma needs no torch

    check_torch(torch)
    if conf is not None:
        os.environ["GMA_CONF"] = conf
    # Load libgma and the plug-in here first: PyTorch's ctypes.CDLL of the
    # same path then reuses them, so gma.torch's exports and gma.Allocator
    # see the very allocators PyTorch allocates from.
    alloc = torch.cuda.memory.CUDAPluggableAllocator(*entry_points())
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc


def stats(device=0):
    """gma_stats of device's allocator as a dict (gma.Allocator.stats' keys);
    all zeros before anything was allocated on it."""
    s = _lib.new(_lib.Stats)
    _check(plugin().gma_torch_stats(device, ctypes.byref(s)), "gma_torch_stats")
    return _to_dict(s)


def summary(device=0):
    """gma_memory_summary of device's allocator, a str."""
    n = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(n)
        st = plugin().gma_torch_summary(device, buf, n)
        if st == -2 and n < (1 << 26):  # GMA_ERR_INVALID_SIZE: too small
            n *= 4
            continue
        _check(st, "gma_torch_summary")
        return _text(buf.value)


def snapshot(device=0, path=None, format="json"):
    """gma_snapshot_write of device's allocator: to path (returned), or as a
    dict. format "json" (gma's own) or "torch" (PyTorch's _snapshot()
    structure; see dump_snapshot)."""
    if format not in ("json", "torch"):
        raise ValueError("snapshot format is 'json' or 'torch', not %r" % (format,))
    if path is not None:
        if format == "json":
            _check(plugin().gma_torch_snapshot(device, os.fsencode(path)), "gma_torch_snapshot")
        else:
            _check(plugin().gma_torch_snapshot_write(device, os.fsencode(path), 1),
                   "gma_torch_snapshot_write")
        return path
    return allocator(device).snapshot(format=format)


def dump_snapshot(path, device=0):
    """What torch.cuda.memory._dump_snapshot(path) is for PyTorch's own
    allocator: writes device's gma memory as a PyTorch-format pickle
    (segments with blocks; with a gma trace running, trace:PATH in GMA_CONF
    or allocator(device).trace_start(), its events in device_traces) that
    pytorch.org/memory_viz and torch.cuda._memory_viz read. Returns path."""
    return snapshot(device, path, format="torch")


def _on_oom(device, requested, allocated, device_free):
    retry = False
    for fn in list(_oom_observers):
        try:
            retry = bool(fn(device, requested, allocated, device_free)) or retry
        except Exception:  # an observer's bug must not turn into a crash in C
            import traceback
            traceback.print_exc()
    return 1 if retry else 0


def attach_out_of_memory_observer(observer):
    """Calls observer(device, alloc, device_allocated, device_free) before gma
    reports an out-of-memory error, as torch._C._cuda_attach_out_of_memory_observer
    does for PyTorch's own allocator (which the plug-in replaces). The observer
    may free memory of its own (drop a cache, then gma.torch.empty_cache());
    if it returns True, gma tries the allocation once more. It runs on the
    allocating thread; allocations it makes itself do not call it again."""
    global _oom_fn
    lib = plugin()  # takes _lock itself
    with _lock:
        _oom_observers.append(observer)
        if _oom_fn is None:
            _oom_fn = _OOM_FN(_on_oom)
            _check(lib.gma_torch_set_oom_observer(ctypes.cast(_oom_fn, ctypes.c_void_p)),
                   "gma_torch_set_oom_observer")


def detach_out_of_memory_observers():
    """Removes every observer attach_out_of_memory_observer added; when it
    returns none of them is running (except when called from one)."""
    global _oom_fn
    lib = plugin()  # takes _lock itself
    with _lock:
        _oom_observers.clear()
        if _oom_fn is not None:
            _check(lib.gma_torch_set_oom_observer(None), "gma_torch_set_oom_observer")
            _oom_fn = None


def empty_cache(device=0):
    """gma_empty_cache on device's allocator (torch.cuda.empty_cache() does not reach it)."""
    _check(plugin().gma_torch_empty_cache(device), "gma_torch_empty_cache")


def iteration_mark(device=0):
    """gma_iteration_mark on device's allocator: call it once per training
    step, at the same point of every step (after optimizer.step(), say).
    With plan:on in GMA_CONF gma plans the memory of the repeating step; under
    plan:off (the default) it does nothing. A no-op before the device's first
    allocation."""
    _check(plugin().gma_torch_iteration_mark(device), "gma_torch_iteration_mark")


def record_stream(tensor, stream, device=None):
    """Tells gma that tensor (or a pointer, an int) is also used on stream
    (a torch.cuda.Stream or a handle), so its free waits for that work.
    Tensor.record_stream does not reach a plug-in: call this instead, after
    queueing the work on stream. A tensor names its whole storage; an int may
    point anywhere inside an allocation (a view's tensor.data_ptr() too): gma
    records the whole allocation it lies in."""
    if isinstance(tensor, int):
        ptr = tensor
        if device is None:
            device = 0
    else:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if device is None:
            device = tensor.device.index or 0
    s = getattr(stream, "cuda_stream", stream)
    _check(plugin().gma_torch_record_stream(ptr, device, s or None), "gma_torch_record_stream")


def allocator(device=0):
    """device's gma allocator as a gma.Allocator that does not own it (for
    pointer_info, stream_stats, trace_start, ...); created if needed."""
    h = plugin().gma_torch_allocator(device)
    if not h:
        raise _error(InvalidArgument.status, "gma_torch_allocator", last_error())
    return Allocator.from_handle(h, owner=plugin())


def graph_pool(device=0):
    """A new gma graph pool of device's allocator (gma.GraphPool), for
    graph(..., pool=...) when several graphs should share one."""
    return allocator(device).graph_pool()


class graph:
    """torch.cuda.graph through gma: the capture's allocations come from a gma
    graph pool (pool, or a new one of the capture device's allocator, kept
    as .pool), announced to gma on the capture stream before the capture
    begins and closed after it ends. Arguments as torch.cuda.graph's, except
    that PyTorch's pool= becomes a gma.GraphPool; stream defaults to a new
    side stream (a capture cannot run on the default stream).
    capture_error_mode is passed on only when it is not "global" (PyTorch's
    default), since torch.cuda.graph takes it from PyTorch 2.1 on."""

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        import torch

        self.device = torch.cuda.current_device()
        self.stream = stream if stream is not None else torch.cuda.Stream()
        self.pool = pool if pool is not None else graph_pool(self.device)
        self._gma = allocator(self.device)
        mode = {} if capture_error_mode == "global" else {"capture_error_mode": capture_error_mode}
        self._torch = torch.cuda.graph(cuda_graph, stream=self.stream, **mode)

    def __enter__(self):
        # Before torch begins the capture: gma records nothing on the stream
        # in between, and binds the capture when it first sees it.
        self._gma.capture_begin(self.stream.cuda_stream, self.pool)
        try:
            self._torch.__enter__()
        except BaseException:
            self._gma.capture_end(self.stream.cuda_stream)
            raise
        return self

    def __exit__(self, *exc):
        try:
            return self._torch.__exit__(*exc)
        finally:
            self._gma.capture_end(self.stream.cuda_stream)
