"""Owns finding and loading libgma, the ctypes mirrors of gma.h's structs, and
the prototypes of the C functions.

Functions are bound lazily, on first use: a libgma built before a function
was added still loads, and only calling that function fails (with
gma.Unsupported). The struct layouts must match include/gma.h exactly;
tests/python/test_sizes.py compares every field offset with the C compiler's.
"""
import ctypes
import ctypes.util
import os
import threading

# ---------------------------------------------------------------------------
# Finding the library
# ---------------------------------------------------------------------------
_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))  # python/gma -> repository root


def _install_libdirs():
    """The install's library directory when the package sits inside one:
    pip install --prefix P (or a venv at P) puts the package in
    P/lib*/pythonX.Y/site-packages/gma, and cmake --install --prefix P puts
    libgma in P/lib*: the nearest ancestor named lib, lib64 or lib/<triplet>."""
    out = []
    d = _HERE
    for _ in range(4):
        d = os.path.dirname(d)
        base = os.path.basename(d)
        if base in ("lib", "lib64", "lib32") or os.path.basename(os.path.dirname(d)) == "lib":
            out.append(d)
    return out


def _candidates(stem):
    """Where to look for lib<stem>.so, in order (after the environment)."""
    names = ["lib%s.so" % stem]
    dirs = [_HERE, os.path.dirname(_HERE)]  # inside the package, or beside it
    dirs += _install_libdirs()
    for sub in ("build/release", "build/debug", "build"):
        dirs.append(os.path.join(_REPO, sub))
    for d in dirs:
        for n in names:
            yield os.path.join(d, n)


def find_library(stem="gma", env="GMA_LIBRARY"):
    """The path of lib<stem>.so: $<env> if set, else next to the package, else
    the install's library directory the package sits in (see
    _install_libdirs), else the repository's build/release, build/debug or
    build tree, else what ctypes.util.find_library finds (a bare name such as
    libgma.so.0; Library.file resolves it once loaded). None when nothing is
    found."""
    path = os.environ.get(env)
    if path:
        return path
    for p in _candidates(stem):
        if os.path.exists(p):
            return p
    return ctypes.util.find_library(stem)


# ---------------------------------------------------------------------------
# Structs (include/gma.h)
# ---------------------------------------------------------------------------
u64 = ctypes.c_uint64
size_t = ctypes.c_size_t
c_int = ctypes.c_int
vp = ctypes.c_void_p


class Config(ctypes.Structure):
    """gma_config_t."""
    _fields_ = [
        ("size", size_t),
        ("device", c_int),
        ("device_ordinal", c_int),
        ("ignore_env", c_int),
        ("memory_limit", u64),
        ("small_size", u64),
        ("small_segment_size", u64),
        ("large_segment_size", u64),
        ("reuse", c_int),
        ("bin_max", u64),
        ("bin_depth", u64),
        ("bins_off", c_int),
        ("sim_capacity", u64),
        ("sim_alloc_latency_ns", u64),
        ("sim_free_latency_ns", u64),
        ("sim_event_latency_ns", u64),
        ("sim_fail_alloc", u64),
        ("sim_fail_event", u64),
        ("trim_interval_ms", u64),
        ("release_threshold", u64),
        ("idle_ms", u64),
        ("grow_ahead", u64),
        ("worker_off", c_int),
        ("ring_size", u64),
        ("future_timeout_ms", u64),
        ("expandable_segments", c_int),
        ("trace_path", ctypes.c_char * 512),
        ("fallback_host", c_int),
        ("host_release_threshold", u64),
        ("oom_wait_ms", u64),
        ("per_thread_default_stream", c_int),
        ("plan", c_int),
        ("sim_costs", c_int),
    ]


class Stat(ctypes.Structure):
    """gma_stat_t."""
    _fields_ = [("current", u64), ("peak", u64), ("total", u64)]


class Stats(ctypes.Structure):
    """gma_stats_t."""
    _fields_ = [
        ("size", size_t),
        ("allocated", Stat),
        ("requested", Stat),
        ("reserved", Stat),
        ("active", Stat),
        ("cached", Stat),
        ("stream_cached_bytes", u64),
        ("pending_bytes", u64),
        ("free_bytes", u64),
        ("num_allocs", u64),
        ("num_frees", u64),
        ("num_device_allocs", u64),
        ("num_device_frees", u64),
        ("num_ooms", u64),
        ("num_oom_retries", u64),
        ("hits_bin", u64),
        ("hits_stream", u64),
        ("hits_pool", u64),
        ("hits_device", u64),
        ("num_segments", u64),
        ("largest_free_block", u64),
        ("fragmentation", ctypes.c_double),
        ("num_streams", u64),
        ("num_cross_stream_waits", u64),
        ("num_epoch_events", u64),
        ("num_batches", u64),
        ("num_batches_split", u64),
        ("bytes_trimmed", u64),
        ("trims_explicit", u64),
        ("trims_timed", u64),
        ("trims_idle", u64),
        ("trims_pressure", u64),
        ("grows_worker", u64),
        ("grows_inline", u64),
        ("worker_wakeups", u64),
        ("pressure_level", c_int),
        ("futures_submitted", u64),
        ("futures_ready_at_once", u64),
        ("futures_ready", u64),
        ("futures_failed", u64),
        ("futures_timed_out", u64),
        ("queue_depth", u64),
        ("submit_to_ready_p50_ns", u64),
        ("submit_to_ready_p99_ns", u64),
        ("host_allocated", Stat),
        ("host_reserved", Stat),
        ("num_host_allocs", u64),
        ("num_host_frees", u64),
        ("num_fallbacks", u64),
        ("fallback_bytes", u64),
        ("num_oom_waits", u64),
        ("plan_state", c_int),
        ("plan_hits", u64),
        ("plan_misses", u64),
        ("plan_replans", u64),
        ("plan_arena_bytes", u64),
        ("plan_lower_bound", u64),
        ("plan_slots", u64),
        ("plan_iterations", u64),
        ("graph_pools", u64),
        ("graph_pool_bytes", u64),
        ("graph_pool_cached_bytes", u64),
        ("graph_captures", u64),
        ("address_ranges", u64),
        ("address_reserved_bytes", u64),
        ("kept_bytes", u64),
        ("kept_chunks", u64),
        ("num_device_remaps", u64),
        ("num_device_keeps", u64),
        ("num_kept_frees", u64),
    ]


class GraphPoolStats(ctypes.Structure):
    """gma_graph_pool_stats_t."""
    _fields_ = [
        ("size", size_t),
        ("id", u64),
        ("reserved_bytes", u64),
        ("peak_reserved_bytes", u64),
        ("allocated_bytes", u64),
        ("chunks", u64),
        ("captures", u64),
        ("allocs", u64),
        ("frees", u64),
    ]


class StreamStats(ctypes.Structure):
    """gma_stream_stats_t."""
    _fields_ = [
        ("size", size_t),
        ("allocs", u64),
        ("frees", u64),
        ("hits", u64),
        ("misses", u64),
        ("allocated_bytes", u64),
        ("cached_bytes", u64),
        ("epoch", u64),
        ("safe_epoch", u64),
    ]


class PointerInfo(ctypes.Structure):
    """gma_pointer_info_t."""
    _fields_ = [
        ("size", size_t),
        ("kind", c_int),
        ("base", vp),
        ("requested", size_t),
        ("block_size", size_t),
        ("stream", vp),
        ("tag", ctypes.c_char_p),
    ]


class AsyncOptions(ctypes.Structure):
    """gma_async_options_t (the callback is not used from Python)."""
    _fields_ = [
        ("size", size_t),
        ("timeout_ns", u64),
        ("nonblocking", c_int),
        ("callback", vp),
        ("user", vp),
        ("worker_only", c_int),
    ]


class Transformer(ctypes.Structure):
    """gma_transformer_t."""
    _fields_ = [
        ("size", size_t),
        ("hidden", u64),
        ("intermediate", u64),
        ("layers", u64),
        ("vocab", u64),
        ("heads", u64),
        ("kv_heads", u64),
        ("seq_len", u64),
        ("batch", u64),
        ("dtype_bytes", u64),
        ("act_dtype_bytes", u64),
        ("kv_cache_tokens", u64),
        ("mode", c_int),
        ("attention", c_int),
        ("optimizer", c_int),
        ("plain_ffn", c_int),
        ("tied_embeddings", c_int),
        ("grads_released", c_int),
        ("step_foreach", c_int),
    ]


class Estimate(ctypes.Structure):
    """gma_estimate_t."""
    _fields_ = [
        ("size", size_t),
        ("total_bytes", u64),
        ("weights_bytes", u64),
        ("weight_copy_bytes", u64),
        ("kv_cache_bytes", u64),
        ("activation_bytes", u64),
        ("logits_bytes", u64),
        ("gradient_bytes", u64),
        ("optimizer_bytes", u64),
        ("step_temp_bytes", u64),
        ("params", u64),
        ("layer_activation_bytes", u64),
        ("phase", c_int),
    ]


STRUCTS = {
    "gma_config_t": Config,
    "gma_stat_t": Stat,
    "gma_stats_t": Stats,
    "gma_stream_stats_t": StreamStats,
    "gma_pointer_info_t": PointerInfo,
    "gma_async_options_t": AsyncOptions,
    "gma_transformer_t": Transformer,
    "gma_estimate_t": Estimate,
}


def new(cls):
    """An instance of a gma struct with its size field set (the _INIT macros)."""
    s = cls()
    if cls._fields_[0][0] == "size":
        s.size = ctypes.sizeof(cls)
    return s


# ---------------------------------------------------------------------------
# Prototypes: name -> (restype, argtypes). status = gma_status_t (an int).
# ---------------------------------------------------------------------------
st = c_int
P = ctypes.POINTER
PROTOTYPES = {
    "gma_status_name": (ctypes.c_char_p, [c_int]),
    "gma_strerror": (ctypes.c_char_p, [c_int]),
    "gma_last_error": (ctypes.c_char_p, []),
    "gma_version": (ctypes.c_char_p, []),
    "gma_config_parse": (st, [P(Config), ctypes.c_char_p]),
    "gma_device_count": (st, [P(c_int)]),
    "gma_select_device": (st, [size_t, P(c_int)]),
    "gma_estimate_transformer": (st, [P(Transformer), P(Estimate)]),
    "gma_create": (st, [P(Config), P(vp)]),
    "gma_destroy": (st, [vp]),
    "gma_device_name": (ctypes.c_char_p, [vp]),
    "gma_alloc": (st, [vp, size_t, vp, P(vp)]),
    "gma_alloc_tagged": (st, [vp, size_t, vp, ctypes.c_char_p, P(vp)]),
    "gma_free": (st, [vp, vp]),
    "gma_record_stream": (st, [vp, vp, vp]),
    "gma_empty_cache": (st, [vp]),
    "gma_iteration_mark": (st, [vp]),
    "gma_graph_pool_create": (st, [vp, P(vp)]),
    "gma_graph_pool_release": (st, [vp, vp]),
    "gma_graph_pool_stats": (st, [vp, vp, P(GraphPoolStats)]),
    "gma_capture_begin": (st, [vp, vp, vp]),
    "gma_capture_end": (st, [vp, vp]),
    "gma_trim": (st, [vp, u64]),
    "gma_alloc_batch": (st, [vp, size_t, P(size_t), vp, P(vp)]),
    "gma_reserve": (st, [vp, vp, size_t, P(size_t), P(size_t)]),
    "gma_alloc_async": (st, [vp, size_t, vp, P(AsyncOptions), P(vp)]),
    "gma_alloc_batch_async": (st, [vp, size_t, P(size_t), vp, P(vp), P(AsyncOptions), P(vp)]),
    "gma_future_poll": (st, [vp]),
    "gma_future_status": (st, [vp]),
    "gma_future_wait": (st, [vp, u64, P(vp)]),
    "gma_future_release": (st, [vp]),
    "gma_future_take": (st, [vp, u64, P(vp)]),
    "gma_stream_retire": (st, [vp, vp]),
    "gma_stats": (st, [vp, P(Stats)]),
    "gma_stream_stats": (st, [vp, vp, P(StreamStats)]),
    "gma_pointer_info": (st, [vp, vp, P(PointerInfo)]),
    "gma_host_alloc": (st, [vp, size_t, vp, P(vp)]),
    "gma_host_free": (st, [vp, vp]),
    "gma_trace_start": (st, [vp, ctypes.c_char_p]),
    "gma_trace_stop": (st, [vp]),
    "gma_snapshot_json": (st, [vp, ctypes.c_char_p]),
    "gma_snapshot_write": (st, [vp, ctypes.c_char_p, c_int]),
    "gma_memory_summary": (st, [vp, ctypes.c_char_p, size_t]),
    "gma_stream_create": (st, [vp, P(vp)]),
    "gma_stream_destroy": (st, [vp, vp]),
    "gma_stream_synchronize": (st, [vp, vp]),
    "gma_stream_wait_stream": (st, [vp, vp, vp]),
    "gma_sim_launch": (st, [vp, vp, vp, vp]),
}


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", vp),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", vp)]


def _loaded_file(function):
    """The absolute path of the shared object holding a ctypes function
    (dladdr), or None."""
    try:
        libc = ctypes.CDLL(None)
        dladdr = libc.dladdr
    except (OSError, AttributeError):
        return None
    dladdr.restype = c_int
    dladdr.argtypes = [vp, ctypes.POINTER(_DlInfo)]
    info = _DlInfo()
    if not dladdr(ctypes.cast(function, vp), ctypes.byref(info)) or not info.dli_fname:
        return None
    name = os.fsdecode(info.dli_fname)
    return os.path.abspath(name) if os.path.sep in name else None


class Library:
    """A loaded libgma whose functions are bound on first use."""

    def __init__(self, path):
        self.path = path
        # RTLD_GLOBAL: libgma_torch.so, loaded later, then resolves to this copy.
        self.cdll = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        self._bound = {}

    @property
    def file(self):
        """The file the library was loaded from, as an absolute path: self.path
        may be a bare name (libgma.so.0) that the dynamic loader resolved
        through its search path; dladdr on one of its functions says where."""
        if os.path.isabs(self.path):
            return self.path
        try:
            return _loaded_file(self.cdll.gma_version) or self.path
        except AttributeError:
            return self.path

    def has(self, name):
        """Whether this libgma exports name."""
        try:
            getattr(self.cdll, name)
            return True
        except AttributeError:
            return False

    def fn(self, name):
        """The bound function, or None when the library does not export it."""
        f = self._bound.get(name, False)
        if f is not False:
            return f
        try:
            f = getattr(self.cdll, name)
            restype, argtypes = PROTOTYPES[name]
            f.restype = restype
            f.argtypes = argtypes
        except AttributeError:
            f = None
        self._bound[name] = f
        return f


_lock = threading.Lock()
_library = None


def load(path=None):
    """The process's libgma (loaded on first call; path overrides the search)."""
    global _library
    with _lock:
        if _library is not None and path and path != _library.path:
            raise RuntimeError("libgma is already loaded from %s" % _library.path)
        if _library is None:
            p = path or find_library()
            if not p:
                raise OSError(
                    "libgma not found: set GMA_LIBRARY to its path, or build it "
                    "(cmake -S . -B build/release && cmake --build build/release)")
            _library = Library(p)
        return _library
