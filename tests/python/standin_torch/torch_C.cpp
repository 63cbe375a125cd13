/* A stand-in for the parts of PyTorch's torch._C that a CUDAPluggableAllocator
 * reaches, for tests/python/test_torch_oom.py (no PyTorch in CI). It does
 * what PyTorch does with the two function addresses it is given:
 *
 *  - _cuda_customAllocator(alloc_fn, free_fn) wraps them in std::function, as
 *    torch/csrc/cuda/CUDAPluggableAllocator.cpp does, and returns the
 *    allocator; _cuda_changeCurrentAllocator makes it the current one;
 *  - _alloc(nbytes, device, stream) is CUDAPluggableAllocator::malloc: it
 *    calls alloc_fn and, only when that returns, records the pointer's size,
 *    device and stream (allocation_metadata_); _free(ptr) is raw_delete;
 *  - every entry translates C++ exceptions the way PyTorch's bindings do
 *    (HANDLE_TH_ERRORS / CATCH_ALL_ERRORS in torch/csrc/Exceptions.h):
 *    c10::OutOfMemoryError to the class registered with
 *    _set_out_of_memory_error (the stand-in's torch.OutOfMemoryError, as
 *    THPException_OutOfMemoryError is), any other c10::Error and
 *    std::exception to RuntimeError.
 *
 * c10 here is the stand-in header (standin_torch/c10/util/Exception.h), the
 * one the test build of the shim is compiled against. What only a GPU with
 * real PyTorch shows: the real c10::OutOfMemoryError crossing from
 * libgma_torch_shim.so into libtorch (same C++ runtime and ABI), and the real
 * translation. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include <c10/util/Exception.h>

namespace {

using AllocFn = std::function<void *(size_t, int, void *)>;
using FreeFn = std::function<void(void *, size_t, int, void *)>;

struct Pluggable {
  AllocFn alloc_fn;
  FreeFn free_fn;
  std::mutex mu;
  std::unordered_map<void *, std::tuple<size_t, int, void *>> metadata;
};

Pluggable *current = nullptr;   /* never freed, like PyTorch's current allocator */
PyObject *oom_class = nullptr;  /* torch.OutOfMemoryError */

/* HANDLE_TH_ERRORS ... END_HANDLE_TH_ERRORS */
template <typename F>
PyObject *translated(F f) {
  try {
    return f();
  } catch (const c10::OutOfMemoryError &e) {
    PyErr_SetString(oom_class ? oom_class : PyExc_MemoryError, e.what());
  } catch (const c10::Error &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyObject *set_out_of_memory_error(PyObject *, PyObject *cls) {
  Py_XDECREF(oom_class);
  Py_INCREF(cls);
  oom_class = cls;
  Py_RETURN_NONE;
}

void destroy_capsule(PyObject *cap) {
  auto *a = static_cast<Pluggable *>(PyCapsule_GetPointer(cap, "gma_standin_allocator"));
  if (a != current) delete a;
}

PyObject *custom_allocator(PyObject *, PyObject *args) {
  unsigned long long alloc_addr, free_addr;
  if (!PyArg_ParseTuple(args, "KK", &alloc_addr, &free_addr)) return nullptr;
  auto *a = new Pluggable;
  a->alloc_fn = reinterpret_cast<void *(*)(size_t, int, void *)>((uintptr_t)alloc_addr);
  a->free_fn = reinterpret_cast<void (*)(void *, size_t, int, void *)>((uintptr_t)free_addr);
  return PyCapsule_New(a, "gma_standin_allocator", destroy_capsule);
}

PyObject *change_current_allocator(PyObject *, PyObject *cap) {
  auto *a = static_cast<Pluggable *>(PyCapsule_GetPointer(cap, "gma_standin_allocator"));
  if (!a) return nullptr;
  if (current) {
    PyErr_SetString(PyExc_RuntimeError, "Can't swap an already initialized allocator");
    return nullptr;
  }
  current = a;
  Py_RETURN_NONE;
}

Pluggable *need_current() {
  if (current) return current;
  throw c10::Error("no allocator: call _cuda_changeCurrentAllocator first");
}

/* CUDAPluggableAllocator::malloc */
PyObject *alloc(PyObject *, PyObject *args) {
  unsigned long long nbytes, stream;
  int device;
  if (!PyArg_ParseTuple(args, "KiK", &nbytes, &device, &stream)) return nullptr;
  return translated([&]() -> PyObject * {
    Pluggable *a = need_current();
    void *s = reinterpret_cast<void *>((uintptr_t)stream);
    void *r = a->alloc_fn((size_t)nbytes, device, s);
    {
      std::lock_guard<std::mutex> lock(a->mu);
      a->metadata.emplace(r, std::make_tuple((size_t)nbytes, device, s));
    }
    return PyLong_FromVoidPtr(r);
  });
}

/* CUDAPluggableAllocator::raw_delete */
PyObject *free_(PyObject *, PyObject *args) {
  unsigned long long ptr;
  if (!PyArg_ParseTuple(args, "K", &ptr)) return nullptr;
  return translated([&]() -> PyObject * {
    Pluggable *a = need_current();
    void *p = reinterpret_cast<void *>((uintptr_t)ptr);
    std::tuple<size_t, int, void *> m;
    {
      std::lock_guard<std::mutex> lock(a->mu);
      auto it = a->metadata.find(p);
      TORCH_CHECK(it != a->metadata.end(), "Trying to free a pointer not allocated here");
      m = it->second;
      a->metadata.erase(it);
    }
    a->free_fn(p, std::get<0>(m), std::get<1>(m), std::get<2>(m));
    Py_RETURN_NONE;
  });
}

/* How many pointers the allocator has recorded (a failed malloc records none). */
PyObject *live_count(PyObject *, PyObject *) {
  if (!current) return PyLong_FromLong(0);
  std::lock_guard<std::mutex> lock(current->mu);
  return PyLong_FromSize_t(current->metadata.size());
}

PyMethodDef methods[] = {
    {"_set_out_of_memory_error", set_out_of_memory_error, METH_O, nullptr},
    {"_cuda_customAllocator", custom_allocator, METH_VARARGS, nullptr},
    {"_cuda_changeCurrentAllocator", change_current_allocator, METH_O, nullptr},
    {"_alloc", alloc, METH_VARARGS, nullptr},
    {"_free", free_, METH_VARARGS, nullptr},
    {"_live_count", live_count, METH_NOARGS, nullptr},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C",
                      "stand-in for torch._C's pluggable allocator (tests only)", -1, methods,
                      nullptr, nullptr, nullptr, nullptr};

} // namespace

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
