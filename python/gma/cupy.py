"""gma under CuPy.

    import gma, gma.cupy
    a = gma.Allocator("device:cuda")
    gma.cupy.use(a)              # every CuPy allocation now comes from a
    x = cupy.zeros(1 << 20)

Each allocation is made on CuPy's current stream; the memory is freed through
gma (ordered on that stream) when CuPy drops its last reference. As with
CuPy's own pool, memory used on another stream needs a.record_stream(ptr,
stream) before it is dropped. The allocator must run on CuPy's current
device. For planned memory (gma.Allocator("...,plan:on")), call
a.iteration_mark() at the same point of every iteration of the loop. cupy is imported only inside use() and reset().
"""


class _Block:
    """Owner of one allocation: frees it through gma when CuPy lets it go."""
    __slots__ = ("allocator", "ptr", "__weakref__")

    def __init__(self, allocator, ptr):
        self.allocator = allocator
        self.ptr = ptr

    def __del__(self):
        a, self.allocator = self.allocator, None
        if a is not None and not a.closed:
            try:
                a.free(self.ptr)
            except Exception:
                pass  # nothing sensible to do in a finalizer


def malloc_function(allocator):
    """The function cupy.cuda.set_allocator takes: size -> MemoryPointer."""
    import cupy

    def malloc(size):
        device = cupy.cuda.runtime.getDevice()
        if size == 0:
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, device), 0)
        stream = cupy.cuda.get_current_stream().ptr
        ptr = allocator.alloc(size, stream=stream)
        owner = _Block(allocator, ptr)
        mem = cupy.cuda.UnownedMemory(ptr, size, owner, device)
        return cupy.cuda.MemoryPointer(mem, 0)

    return malloc


def use(allocator):
    """Makes allocator (a gma.Allocator) CuPy's allocator. Returns the malloc
    function installed."""
    import cupy

    f = malloc_function(allocator)
    cupy.cuda.set_allocator(f)
    return f


def reset():
    """Gives CuPy its default memory pool back."""
    import cupy

    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
