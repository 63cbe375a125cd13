"""gma for Python: a ctypes binding of libgma (standard library only).

    import gma
    with gma.Allocator("device:sim,sim_capacity:1G") as a:
        s = a.stream_create()
        p = a.alloc(1 << 20, stream=s, tag="weights")   # an int: the device address
        a.free(p)                                        # ordered on s
        print(a.summary())

Pointers and streams are ints (a stream may also be any object with a .ptr
(CuPy) or .cuda_stream (PyTorch) attribute; None is the default stream).
Every failing call raises a gma.Error subclass named after its status
(OutOfMemory, InvalidPointer, DoubleFree, ...) that carries the status,
gma_strerror() and gma_last_error(). Allocator methods may be called from
any number of threads (ctypes releases the GIL during each call), except
close(). libgma is found through GMA_LIBRARY, else next to this package,
else the repository's build/release, build/debug or build tree, else the
system's library path (see gma._lib.find_library).
"""
import ctypes
import itertools
import json
import operator
import os
import tempfile

from . import _lib

__all__ = [
    "Allocator", "Future", "GraphPool", "Error", "InvalidArgument", "InvalidSize", "OutOfMemory",
    "InvalidPointer", "DoubleFree", "ConfigError", "DeviceError", "NoDevice", "Unsupported",
    "Leak", "InternalError", "Timeout", "Busy", "Cancelled", "AlreadyCollected", "Pending", "STREAM_LEGACY",
    "STREAM_PER_THREAD", "device_count", "select_device", "estimate_transformer", "version",
    "status_name",
    "strerror", "last_error", "available", "library_path",
]

__version__ = "0.1.0"

STREAM_LEGACY = 0x1      # GMA_STREAM_LEGACY: the device's legacy default stream
STREAM_PER_THREAD = 0x2  # GMA_STREAM_PER_THREAD: the calling thread's default stream

MEMORY_KINDS = {0: "device", 1: "host_pinned", 2: "fallback"}
_UINT64_MAX = (1 << 64) - 1


# ---------------------------------------------------------------------------
# Errors: one class per gma_status_t
# ---------------------------------------------------------------------------
class Error(Exception):
    """A gma call failed. Attributes: status (the gma_status_t value),
    status_name ("GMA_ERR_OOM"), strerror (what the status means and what to
    do), detail (gma_last_error(): the call's own message), function."""

    status = None

    def __init__(self, status, function, detail, strerror_text, name):
        self.status = status
        self.status_name = name
        self.strerror = strerror_text
        self.detail = detail
        self.function = function
        # "GMA_ERR_X: function: what happened" (gma's messages mostly start
        # with the status name already, and often name the function).
        msg = detail or strerror_text
        if msg.startswith(name + ": "):
            msg = msg[len(name) + 2:]
        if function and function not in msg:
            msg = "%s: %s" % (function, msg)
        super().__init__("%s: %s" % (name, msg))

    def __reduce__(self):
        return (type(self), (self.status, self.function, self.detail, self.strerror,
                             self.status_name))


class InvalidArgument(Error, ValueError): status = -1
class InvalidSize(Error, ValueError): status = -2
class OutOfMemory(Error, MemoryError): status = -3
class InvalidPointer(Error, ValueError): status = -4
class DoubleFree(Error, ValueError): status = -5
class ConfigError(Error, ValueError): status = -6
class DeviceError(Error): status = -7
class NoDevice(Error): status = -8
class Unsupported(Error, NotImplementedError): status = -9
class Leak(Error): status = -10
class InternalError(Error): status = -11
class Timeout(Error): status = -12
class Busy(Error): status = -13
class Cancelled(Error): status = -14
class AlreadyCollected(Error):
    """Another wait (on any thread) already took this future's memory."""
    status = -15
class Pending(Error):
    """A Future.wait ran out before the request completed (the request goes on)."""
    status = 1


_CLASSES = {c.status: c for c in (
    InvalidArgument, InvalidSize, OutOfMemory, InvalidPointer, DoubleFree, ConfigError,
    DeviceError, NoDevice, Unsupported, Leak, InternalError, Timeout, Busy, Cancelled,
    AlreadyCollected, Pending)}


def _L():
    return _lib.load()


def _text(b):
    return b.decode("utf-8", "replace") if b else ""


def status_name(status):
    """gma_status_name: "GMA_ERR_OOM" for -3."""
    return _text(_L().fn("gma_status_name")(status))


def strerror(status):
    """gma_strerror: what a status means and what to do, one sentence."""
    return _text(_L().fn("gma_strerror")(status))


def last_error():
    """gma_last_error(): the detail of the calling thread's last failing call."""
    return _text(_L().fn("gma_last_error")())


def _error(status, function, detail=None):
    """The exception for status; detail defaults to gma_last_error()."""
    if detail is None:
        detail = last_error()
    cls = _CLASSES.get(status, Error)
    return cls(status, function, detail, strerror(status), status_name(status))


def _check(status, function):
    if status != 0:
        # gma_last_error() first: it is the calling thread's, and nothing
        # else may run a gma call in between.
        raise _error(status, function)


def _fn(name):
    """The bound C function; gma.Unsupported when this libgma lacks it."""
    lib = _L()
    f = lib.fn(name)
    if f is None:
        raise _error(Unsupported.status, name,
                     "%s does not export %s (built before it was added)" % (lib.path, name))
    return f


def available(name):
    """Whether the loaded libgma exports the C function name."""
    return _L().has(name)


def library_path():
    """The path of the loaded libgma."""
    return _L().path


def version():
    """gma_version(): "major.minor.patch" of the loaded libgma."""
    return _text(_fn("gma_version")())


def device_count():
    """Number of CUDA devices; 0 when there is no driver, no GPU, or no CUDA
    backend in this build (gma_device_count's GMA_ERR_NO_DEVICE)."""
    n = ctypes.c_int(0)
    st = _fn("gma_device_count")(ctypes.byref(n))
    if st == NoDevice.status:
        return 0
    _check(st, "gma_device_count")
    return n.value


def select_device(size):
    """gma_select_device: the CUDA device with the most free memory among those
    with at least size bytes free. Raises NoDevice or OutOfMemory."""
    d = ctypes.c_int(-1)
    _check(_fn("gma_select_device")(size, ctypes.byref(d)), "gma_select_device")
    return d.value


_DTYPES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
           "fp8": 1, "fp64": 8, "float64": 8}
_MODES = ("inference", "forward", "training")
_ATTENTIONS = ("eager", "eager_exp", "fused")
_OPTIMIZERS = ("adam", "adam_master", "sgd_momentum", "sgd")
_PHASES = ("layer", "head", "forward_end", "backward", "step")


def _choice(value, names, what):
    if value in names:
        return names.index(value)
    raise ValueError("%s is %r; use one of %s" % (what, value, ", ".join(names)))


def _dtype(value, what):
    if isinstance(value, str):
        if value not in _DTYPES:
            raise ValueError("%s is %r; use a byte count or one of %s"
                             % (what, value, ", ".join(sorted(_DTYPES))))
        return _DTYPES[value]
    return operator.index(value)


def estimate_transformer(hidden, layers, vocab, heads, seq_len, *, intermediate=0,
                         kv_heads=0, batch=1, dtype="fp32", act_dtype=None, mode="inference",
                         attention="eager", optimizer="adam", plain_ffn=False,
                         tied_embeddings=False, grads_released=False, step_foreach=False,
                         kv_cache_tokens=0):
    """gma_estimate_transformer: the peak memory of a decoder-only transformer
    (docs/estimate.md), as a dict of gma_estimate_t's fields (bytes; "phase"
    is one of "layer", "head", "forward_end", "backward", "step"). dtype and
    act_dtype are byte counts or names ("fp32", "bf16", ...); mode is
    "inference", "forward" or "training"; attention "eager", "eager_exp" or
    "fused"; optimizer "adam", "adam_master", "sgd_momentum" or "sgd". Raises
    gma.InvalidArgument with gma's message for dimensions it refuses, and
    ValueError for an unknown name."""
    m = _lib.new(_lib.Transformer)
    counts = dict(hidden=hidden, layers=layers, vocab=vocab, heads=heads, seq_len=seq_len,
                  intermediate=intermediate, kv_heads=kv_heads, batch=batch,
                  kv_cache_tokens=kv_cache_tokens, dtype_bytes=_dtype(dtype, "dtype"),
                  act_dtype_bytes=0 if act_dtype is None else _dtype(act_dtype, "act_dtype"))
    for name, v in counts.items():
        v = operator.index(v)
        if not 0 <= v <= _UINT64_MAX:
            raise ValueError("%s is %d; it must be 0 to 2^64 - 1" % (name, v))
        setattr(m, name, v)
    m.mode = _choice(mode, _MODES, "mode")
    m.attention = _choice(attention, _ATTENTIONS, "attention")
    m.optimizer = _choice(optimizer, _OPTIMIZERS, "optimizer")
    m.plain_ffn, m.tied_embeddings = int(bool(plain_ffn)), int(bool(tied_embeddings))
    m.grads_released, m.step_foreach = int(bool(grads_released)), int(bool(step_foreach))
    out = _lib.new(_lib.Estimate)
    _check(_fn("gma_estimate_transformer")(ctypes.byref(m), ctypes.byref(out)),
           "gma_estimate_transformer")
    d = _to_dict(out)
    d["phase"] = _PHASES[out.phase]
    return d


def _stream(s):
    """A stream argument as the C handle: None/0 (default stream), an int, or
    an object with .ptr (CuPy) or .cuda_stream (PyTorch)."""
    if s is None:
        return None
    if isinstance(s, int):
        return s or None
    for attr in ("ptr", "cuda_stream"):
        v = getattr(s, attr, None)
        if isinstance(v, int):
            return v or None
    raise TypeError("a stream is None, an int, or has .ptr or .cuda_stream, not %r" % (s,))


def _size(n, function):
    n = operator.index(n)  # an int (or numpy integer); not a float
    if n < 0:
        raise _error(InvalidSize.status, function, "size is negative (%d)" % n)
    return n


def _to_dict(s):
    out = {}
    for name, ctype in s._fields_:
        if name == "size":
            continue
        v = getattr(s, name)
        out[name] = _to_dict(v) if isinstance(v, ctypes.Structure) else v
    return out


def _options(timeout, nonblocking, worker_only=False):
    o = _lib.new(_lib.AsyncOptions)
    if timeout is not None:
        if timeout <= 0:
            raise _error(InvalidArgument.status, "gma_alloc_async",
                         "timeout must be positive seconds, not %r" % (timeout,))
        o.timeout_ns = max(1, int(timeout * 1e9))
    o.nonblocking = 1 if nonblocking else 0
    o.worker_only = 1 if worker_only else 0
    return o


# Simulated kernels: one C-callable thunk for the whole process (a thunk
# must outlive every call into it), and the Python function of each launch
# under a token passed as the kernel's argument.
_kernels = {}
_kernel_tokens = itertools.count(1)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _run_kernel(arg):
    fn = _kernels.pop(arg, None)
    if fn is not None:
        fn()


# ---------------------------------------------------------------------------
# The allocator
# ---------------------------------------------------------------------------
# gma_snapshot_format_t (gma.h)
SNAPSHOT_JSON = 0
SNAPSHOT_TORCH = 1


def load_torch_snapshot(path):
    """A PyTorch-format snapshot (gma_snapshot_write GMA_SNAPSHOT_TORCH, or
    torch.cuda.memory._dump_snapshot) as a dict, loaded with an unpickler
    that refuses every global: a snapshot is plain dicts, lists, tuples,
    strings and numbers, and a pickle that names a global could run code."""
    import pickle

    class _Plain(pickle.Unpickler):
        def find_class(self, module, name):
            raise pickle.UnpicklingError(
                "%s names the global %s.%s: not a plain memory snapshot" % (path, module, name))

    with open(path, "rb") as fh:
        return _Plain(fh).load()


class Allocator:
    """One gma allocator (gma_create). conf is a GMA_CONF-style string
    ("device:sim,memory_limit:4G"); with use_env (the default) GMA_CONF from
    the environment is applied first and conf after it, so conf wins.
    A context manager: leaving it destroys the allocator (close()).
    """

    def __init__(self, conf=None, *, use_env=True):
        self._g = None
        self._owned = True
        cfg = _lib.new(_lib.Config)
        parse = _fn("gma_config_parse")
        env = os.environ.get("GMA_CONF") if use_env else None
        if env:
            st = parse(ctypes.byref(cfg), env.encode())
            if st:
                detail = last_error()
                name = status_name(st) + ": "
                if detail.startswith(name):  # one status name in the message, not two
                    detail = detail[len(name):]
                raise _error(st, "gma_config_parse", "in GMA_CONF=%r: %s" % (env, detail))
        if conf:
            _check(parse(ctypes.byref(cfg), conf.encode()), "gma_config_parse")
        cfg.ignore_env = 1
        h = ctypes.c_void_p()
        _check(_fn("gma_create")(ctypes.byref(cfg), ctypes.byref(h)), "gma_create")
        self._g = h.value

    @classmethod
    def from_handle(cls, handle, owner=None):
        """Wraps an allocator someone else created and destroys (e.g. the
        PyTorch plug-in's, gma.torch.allocator()); close() leaves it alone.
        owner is kept alive as long as the wrapper."""
        if not handle:
            raise _error(InvalidArgument.status, "Allocator.from_handle", "handle is NULL")
        self = cls.__new__(cls)
        self._g = int(handle)
        self._owned = False
        self._owner = owner
        return self

    # -- lifetime -------------------------------------------------------------
    @property
    def handle(self):
        """The gma_t * as an int (for calling libgma directly)."""
        return self._h("handle")

    @property
    def closed(self):
        return self._g is None

    def _h(self, function):
        if self._g is None:
            raise _error(InvalidArgument.status, function, "the allocator is closed")
        return self._g

    def close(self):
        """gma_destroy. Raises Leak if allocations were still live (gma freed
        them and printed a report). A second close does nothing."""
        g, self._g = self._g, None
        if g is not None and self._owned:
            _check(_fn("gma_destroy")(g), "gma_destroy")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.close()
        except Leak:
            if exc_type is None:
                raise  # leaking is an error of its own; never hide another one

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        if self._g is None:
            return "<gma.Allocator closed>"
        return "<gma.Allocator %s at 0x%x>" % (self.device_name, self._g)

    @property
    def device_name(self):
        """"sim" or "cuda"."""
        return _text(_fn("gma_device_name")(self._h("gma_device_name")))

    # -- allocation -----------------------------------------------------------
    def alloc(self, size, stream=None, tag=None):
        """gma_alloc (gma_alloc_tagged with tag): the device address, an int."""
        g = self._h("gma_alloc")
        size = _size(size, "gma_alloc")
        out = ctypes.c_void_p()
        if tag is None:
            _check(_fn("gma_alloc")(g, size, _stream(stream), ctypes.byref(out)), "gma_alloc")
        else:
            f = _fn("gma_alloc_tagged")
            _check(f(g, size, _stream(stream), tag.encode(), ctypes.byref(out)),
                   "gma_alloc_tagged")
        return out.value

    def free(self, ptr):
        """gma_free: ordered on the stream ptr was allocated on. None is a no-op."""
        _check(_fn("gma_free")(self._h("gma_free"), ptr), "gma_free")

    def record_stream(self, ptr, stream):
        """gma_record_stream: ptr is also used on stream (call after queueing
        that work, before free)."""
        _check(_fn("gma_record_stream")(self._h("gma_record_stream"), ptr, _stream(stream)),
               "gma_record_stream")

    def alloc_batch(self, sizes, stream=None):
        """gma_alloc_batch: a list of addresses, all or nothing."""
        g = self._h("gma_alloc_batch")
        n = len(sizes)
        arr = (ctypes.c_size_t * n)(*[_size(s, "gma_alloc_batch") for s in sizes])
        ptrs = (ctypes.c_void_p * n)()
        _check(_fn("gma_alloc_batch")(g, n, arr, _stream(stream), ptrs), "gma_alloc_batch")
        return [p for p in ptrs]

    def reserve(self, sizes, counts, stream=None):
        """gma_reserve: warm the stream's bins with counts[i] blocks of sizes[i]."""
        g = self._h("gma_reserve")
        if len(sizes) != len(counts):
            raise _error(InvalidArgument.status, "gma_reserve",
                         "sizes and counts differ in length")
        n = len(sizes)
        s = (ctypes.c_size_t * n)(*sizes)
        c = (ctypes.c_size_t * n)(*counts)
        _check(_fn("gma_reserve")(g, _stream(stream), n, s, c), "gma_reserve")

    def alloc_async(self, size, stream=None, timeout=None, nonblocking=False,
                    worker_only=False):
        """gma_alloc_async: a Future at once. timeout: seconds the request may
        wait for memory (None: the allocator's future_timeout_ms);
        worker_only: never served on this thread (always the worker)."""
        g = self._h("gma_alloc_async")
        size = _size(size, "gma_alloc_async")
        o = _options(timeout, nonblocking, worker_only)
        f = ctypes.c_void_p()
        _check(_fn("gma_alloc_async")(g, size, _stream(stream), ctypes.byref(o),
                                      ctypes.byref(f)), "gma_alloc_async")
        return Future(self, f.value)

    def alloc_batch_async(self, sizes, stream=None, timeout=None, nonblocking=False,
                          worker_only=False):
        """gma_alloc_batch_async: a Future whose wait() gives the list."""
        g = self._h("gma_alloc_batch_async")
        n = len(sizes)
        arr = (ctypes.c_size_t * n)(*[_size(s, "gma_alloc_batch_async") for s in sizes])
        ptrs = (ctypes.c_void_p * n)()
        o = _options(timeout, nonblocking, worker_only)
        f = ctypes.c_void_p()
        _check(_fn("gma_alloc_batch_async")(g, n, arr, _stream(stream), ptrs, ctypes.byref(o),
                                            ctypes.byref(f)), "gma_alloc_batch_async")
        return Future(self, f.value, ptrs)

    def trim(self, keep_bytes=0):
        """gma_trim: give cached memory back until at most keep_bytes stay."""
        _check(_fn("gma_trim")(self._h("gma_trim"), int(keep_bytes)), "gma_trim")

    def empty_cache(self):
        """gma_empty_cache."""
        _check(_fn("gma_empty_cache")(self._h("gma_empty_cache")), "gma_empty_cache")

    def iteration_mark(self):
        """gma_iteration_mark: marks the end of one iteration of a repeating
        workload (for example after the optimizer step), at the same point of
        every iteration. Under plan:on gma learns an iteration between two marks
        and serves later iterations from one planned arena; under plan:off (the
        default) it does nothing. Raises gma.Unsupported with a libgma that
        lacks the call."""
        _check(_fn("gma_iteration_mark")(self._h("gma_iteration_mark")), "gma_iteration_mark")

    # -- CUDA graphs ------------------------------------------------------------
    def graph_pool(self):
        """gma_graph_pool_create: a GraphPool for the allocations of CUDA
        graph captures (see capture_begin)."""
        h = ctypes.c_void_p()
        _check(_fn("gma_graph_pool_create")(self._h("gma_graph_pool_create"), ctypes.byref(h)),
               "gma_graph_pool_create")
        return GraphPool(self, h.value)

    def capture_begin(self, stream, pool):
        """gma_capture_begin: stream is about to capture a CUDA graph (call it
        before cuStreamBeginCapture); its allocations, and those of streams
        that join the capture, come from pool (a GraphPool of this allocator)
        until capture_end. Raises gma.Unsupported on the simulated device."""
        _check(_fn("gma_capture_begin")(self._h("gma_capture_begin"), _stream(stream),
                                        pool._handle()), "gma_capture_begin")

    def capture_end(self, stream):
        """gma_capture_end: the capture capture_begin announced on stream ended."""
        _check(_fn("gma_capture_end")(self._h("gma_capture_end"), _stream(stream)),
               "gma_capture_end")

    # -- pinned host memory ---------------------------------------------------
    def host_alloc(self, size, stream=None):
        """gma_host_alloc: pinned host memory (an int address)."""
        g = self._h("gma_host_alloc")
        out = ctypes.c_void_p()
        _check(_fn("gma_host_alloc")(g, _size(size, "gma_host_alloc"), _stream(stream),
                                     ctypes.byref(out)), "gma_host_alloc")
        return out.value

    def host_free(self, ptr):
        """gma_host_free: stream-ordered, like free."""
        _check(_fn("gma_host_free")(self._h("gma_host_free"), ptr), "gma_host_free")

    def pointer_info(self, ptr):
        """gma_pointer_info: kind ("device", "host_pinned", "fallback"), base,
        requested, block_size, stream, tag of the live allocation ptr is in."""
        g = self._h("gma_pointer_info")
        info = _lib.new(_lib.PointerInfo)
        _check(_fn("gma_pointer_info")(g, ptr, ctypes.byref(info)), "gma_pointer_info")
        return {
            "kind": MEMORY_KINDS.get(info.kind, info.kind),
            "base": info.base,
            "requested": info.requested,
            "block_size": info.block_size,
            "stream": info.stream,
            "tag": _text(info.tag),
        }

    # -- streams --------------------------------------------------------------
    def stream_create(self):
        """gma_stream_create: a new stream handle (an int)."""
        s = ctypes.c_void_p()
        _check(_fn("gma_stream_create")(self._h("gma_stream_create"), ctypes.byref(s)),
               "gma_stream_create")
        return s.value

    def stream_destroy(self, stream):
        """gma_stream_destroy: retires the stream in gma, then destroys it."""
        _check(_fn("gma_stream_destroy")(self._h("gma_stream_destroy"), _stream(stream)),
               "gma_stream_destroy")

    def stream_synchronize(self, stream=None):
        """gma_stream_synchronize: waits for the work queued on stream."""
        _check(_fn("gma_stream_synchronize")(self._h("gma_stream_synchronize"),
                                             _stream(stream)), "gma_stream_synchronize")

    def stream_wait_stream(self, waiter, waitee):
        """gma_stream_wait_stream: work queued on waiter from now on waits until
        the work queued on waitee so far has finished (the device orders them;
        the host does not wait), like torch.cuda.Stream.wait_stream."""
        _check(_fn("gma_stream_wait_stream")(self._h("gma_stream_wait_stream"), _stream(waiter),
                                             _stream(waitee)), "gma_stream_wait_stream")

    def stream_retire(self, stream):
        """gma_stream_retire: call before destroying a stream gma has seen."""
        _check(_fn("gma_stream_retire")(self._h("gma_stream_retire"), _stream(stream)),
               "gma_stream_retire")

    def sim_launch(self, stream, fn):
        """gma_sim_launch (simulated device only): queues fn() on stream; it
        runs on the stream's own thread after the work queued before it, and
        later work waits for it to return. Exceptions in fn are printed and
        otherwise ignored (the stream goes on)."""
        g = self._h("gma_sim_launch")
        token = next(_kernel_tokens)
        _kernels[token] = fn
        st = _fn("gma_sim_launch")(g, _stream(stream), ctypes.cast(_run_kernel, ctypes.c_void_p),
                                   token)
        if st:
            _kernels.pop(token, None)
        _check(st, "gma_sim_launch")

    # -- observing ------------------------------------------------------------
    def stats(self):
        """gma_stats as a dict of every gma_stats_t field; gma_stat_t fields
        are dicts of current, peak and total."""
        s = _lib.new(_lib.Stats)
        _check(_fn("gma_stats")(self._h("gma_stats"), ctypes.byref(s)), "gma_stats")
        return _to_dict(s)

    def stream_stats(self, stream=None):
        """gma_stream_stats of one stream, as a dict."""
        s = _lib.new(_lib.StreamStats)
        _check(_fn("gma_stream_stats")(self._h("gma_stream_stats"), _stream(stream),
                                       ctypes.byref(s)), "gma_stream_stats")
        return _to_dict(s)

    def summary(self):
        """gma_memory_summary: the human-readable table, a str."""
        g = self._h("gma_memory_summary")
        f = _fn("gma_memory_summary")
        n = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(n)
            st = f(g, buf, n)
            if st == InvalidSize.status and n < (1 << 26):
                n *= 4
                continue
            _check(st, "gma_memory_summary")
            return _text(buf.value)

    def snapshot(self, path=None, format="json"):
        """gma_snapshot_write. format "json" (gma_snapshot_json: gma's own
        JSON) or "torch" (GMA_SNAPSHOT_TORCH: a pickle with the structure of
        torch.cuda.memory._snapshot(), the running trace's events in
        device_traces; for pytorch.org/memory_viz). With a path: writes it
        there and returns path. Without: returns the snapshot as a dict (read
        from a temp file; a torch one with load_torch_snapshot)."""
        if format == "torch":
            return self._snapshot_torch(path)
        if format != "json":
            raise ValueError("snapshot format is 'json' or 'torch', not %r" % (format,))
        g = self._h("gma_snapshot_json")
        f = _fn("gma_snapshot_json")
        if path is not None:
            _check(f(g, os.fsencode(path)), "gma_snapshot_json")
            return path
        fd, tmp = tempfile.mkstemp(prefix="gma-snapshot-", suffix=".json")
        os.close(fd)
        try:
            _check(f(g, os.fsencode(tmp)), "gma_snapshot_json")
            with open(tmp) as fh:
                return json.load(fh)
        finally:
            os.unlink(tmp)

    def _snapshot_torch(self, path):
        g = self._h("gma_snapshot_write")
        f = _fn("gma_snapshot_write")
        if path is not None:
            _check(f(g, os.fsencode(path), SNAPSHOT_TORCH), "gma_snapshot_write")
            return path
        fd, tmp = tempfile.mkstemp(prefix="gma-snapshot-", suffix=".pickle")
        os.close(fd)
        try:
            _check(f(g, os.fsencode(tmp), SNAPSHOT_TORCH), "gma_snapshot_write")
            return load_torch_snapshot(tmp)
        finally:
            os.unlink(tmp)

    def trace_start(self, path):
        """gma_trace_start: record every allocation event to path (gma's trace CSV)."""
        _check(_fn("gma_trace_start")(self._h("gma_trace_start"), os.fsencode(path)),
               "gma_trace_start")

    def trace_stop(self):
        """gma_trace_stop: flush and close the trace."""
        _check(_fn("gma_trace_stop")(self._h("gma_trace_stop")), "gma_trace_stop")


# ---------------------------------------------------------------------------
# Futures
# ---------------------------------------------------------------------------
class Future:
    """The answer to alloc_async / alloc_batch_async. poll() says whether it
    completed; wait(timeout) gives the address (a list for a batch), after
    which the memory is the caller's to free; release() gives the future back
    (a request still pending is cancelled, and memory no wait collected is
    freed). A context manager that releases on exit; also released when
    collected."""

    def __init__(self, allocator, handle, batch_ptrs=None):
        self._allocator = allocator  # keeps the allocator alive while we are
        self._f = handle
        self._batch = batch_ptrs     # the array gma fills: must outlive the request
        self._result = None
        self._collected = False

    def _h(self, function):
        if self._f is None:
            raise _error(InvalidArgument.status, function, "the future was released")
        return self._f

    def poll(self):
        """True when complete with memory, False while pending; raises the
        request's error (Timeout, OutOfMemory, Cancelled, ...) if it failed."""
        st = _fn("gma_future_poll")(self._h("gma_future_poll"))
        if st == Pending.status:
            return False
        _check(st, "gma_future_poll")
        return True

    done = poll

    def wait(self, timeout=None):
        """Waits up to timeout seconds (None: no limit) and returns the
        address (a list for a batch). Raises Pending when this wait ran out
        (the request goes on), or the request's error."""
        f = self._h("gma_future_wait")
        if self._collected:
            return self._result
        ns = _UINT64_MAX if timeout is None else max(0, int(timeout * 1e9))
        p = ctypes.c_void_p()
        _check(_fn("gma_future_wait")(f, ns, ctypes.byref(p)), "gma_future_wait")
        self._result = [x for x in self._batch] if self._batch is not None else p.value
        self._collected = True
        return self._result

    result = wait

    def take(self, timeout=None):
        """gma_future_take: waits up to timeout seconds (None: no limit),
        returns the address (a list for a batch) and releases the future, in
        one call. Raises Pending when this wait ran out: the future is NOT
        released and the request goes on (take, wait or release it later).
        Any other error (the request's, Cancelled, AlreadyCollected) is raised
        after the future was released. After a wait() that collected, take()
        returns the same result and releases."""
        f = self._h("gma_future_take")
        if self._collected:
            self.release()
            return self._result
        ns = _UINT64_MAX if timeout is None else max(0, int(timeout * 1e9))
        p = ctypes.c_void_p()
        st = _fn("gma_future_take")(f, ns, ctypes.byref(p))
        if st != Pending.status:
            self._f = None  # released by gma_future_take
        _check(st, "gma_future_take")
        self._result = [x for x in self._batch] if self._batch is not None else p.value
        self._collected = True
        return self._result

    def release(self):
        """gma_future_release (once; later calls do nothing)."""
        f, self._f = self._f, None
        if f is not None:
            _fn("gma_future_release")(f)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


class GraphPool:
    """A gma graph pool (gma_graph_pool_create, through Allocator.graph_pool):
    memory for the allocations of CUDA graph captures, never handed to anyone
    else until release(). Graphs sharing one pool must be launched in the
    order they were captured."""

    def __init__(self, allocator, handle):
        self._alloc = allocator
        self._h = handle

    def _handle(self):
        if self._h is None:
            raise _error(InvalidArgument.status, "GraphPool",
                         "this graph pool was released (GraphPool.release)")
        return self._h

    def stats(self):
        """gma_graph_pool_stats as a dict."""
        s = _lib.new(_lib.GraphPoolStats)
        _check(_fn("gma_graph_pool_stats")(self._alloc._h("gma_graph_pool_stats"), self._handle(),
                                           ctypes.byref(s)), "gma_graph_pool_stats")
        return _to_dict(s)

    def release(self):
        """gma_graph_pool_release: no graph captured into this pool will be
        launched again. Waits once for the device's queued work, then gives
        the pool's unused memory back (the rest as it is freed)."""
        _check(_fn("gma_graph_pool_release")(self._alloc._h("gma_graph_pool_release"),
                                             self._handle()), "gma_graph_pool_release")
        self._h = None
