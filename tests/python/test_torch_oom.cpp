/* The C++ shim (plugins/torch/gma_torch_shim.cpp) built against the stand-in
 * c10 header (tests/python/standin_torch), called the way PyTorch's
 * CUDAPluggableAllocator calls it (through a std::function) inside a
 * try/catch, on the simulated device:
 *
 *  - an allocation gma cannot satisfy throws c10::OutOfMemoryError, for a
 *    request bigger than the device (GMA_ERR_INVALID_SIZE) and for one that
 *    fits the device but not now (GMA_ERR_OOM); the message carries
 *    gma_torch_last_error() (gma_last_error()'s text included);
 *  - 2000 such failures leave gma's counters and reserved memory as they were
 *    (and, in the ASan build, LeakSanitizer sees no leak at exit); the
 *    allocator serves the same request once memory is freed;
 *  - other failures (a bad device, after the plug-in's shutdown) throw
 *    c10::Error that is not an OutOfMemoryError; size 0 gives NULL.
 *
 * Registered in every build, sanitizers included (label plugin). */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include <c10/util/Exception.h>

#include "gma_torch.h"

extern "C" void *gma_torch_shim_alloc(ssize_t size, int device, void *stream);
extern "C" void gma_torch_shim_free(void *ptr, ssize_t size, int device, void *stream) noexcept;

static int failures = 0;
#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (!(cond)) {                                                \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                          \
      std::fputc('\n', stderr);                                   \
      failures++;                                                 \
    }                                                             \
  } while (0)

static const size_t MiB = 1 << 20;

/* CUDAPluggableAllocator holds the function as a std::function. */
static std::function<void *(size_t, int, void *)> alloc_fn = [](size_t n, int d, void *s) {
  return gma_torch_shim_alloc((ssize_t)n, d, s);
};

enum caught { NONE, OOM, ERROR, OTHER };
struct outcome {
  caught what = NONE;
  std::string msg;
  void *ptr = nullptr;
};

static outcome try_alloc(size_t n, int device = 0) {
  outcome o;
  try {
    o.ptr = alloc_fn(n, device, nullptr);
  } catch (const c10::OutOfMemoryError &e) {
    o.what = OOM;
    o.msg = e.what();
  } catch (const c10::Error &e) {
    o.what = ERROR;
    o.msg = e.what();
  } catch (...) {
    o.what = OTHER;
  }
  return o;
}

static gma_stats_t stats(int device = 0) {
  gma_stats_t s{}; /* GMA_STATS_INIT, without C++'s missing-initializer warning */
  s.size = sizeof s;
  int st = gma_torch_stats(device, &s);
  CHECK(st == GMA_OK, "gma_torch_stats: %s", gma_torch_last_error());
  return s;
}

static bool has(const std::string &s, const char *part) { return s.find(part) != std::string::npos; }

int main() {
  setenv("GMA_CONF", "device:sim,sim_capacity:64M", 1); /* read at the first allocation */

  outcome ok = try_alloc(1 * MiB);
  CHECK(ok.what == NONE && ok.ptr, "a 1 MiB allocation failed: %s", ok.msg.c_str());
  gma_torch_shim_free(ok.ptr, 1 * MiB, 0, nullptr);

  outcome zero = try_alloc(0);
  CHECK(zero.what == NONE && !zero.ptr, "size 0 must give NULL without throwing");

  /* Bigger than the device. */
  outcome big = try_alloc(128 * MiB);
  CHECK(big.what == OOM, "128 MiB on a 64 MiB device: expected c10::OutOfMemoryError (got %d)",
        big.what);
  CHECK(has(big.msg, "gma: out of memory: tried to allocate 128.00 MiB on device 0"), "%s",
        big.msg.c_str());
  CHECK(has(big.msg, "GMA_ERR_INVALID_SIZE"), "%s", big.msg.c_str());
  CHECK(has(big.msg, gma_torch_last_error()), "the message lacks gma_torch_last_error(): %s",
        big.msg.c_str());

  /* Fits the device, not now: another tensor holds most of it. */
  outcome hold = try_alloc(48 * MiB);
  CHECK(hold.what == NONE && hold.ptr, "48 MiB failed: %s", hold.msg.c_str());
  outcome now = try_alloc(32 * MiB);
  CHECK(now.what == OOM, "32 MiB with 48 of 64 MiB live: expected OutOfMemoryError (got %d)",
        now.what);
  CHECK(has(now.msg, "GMA_ERR_OOM"), "%s", now.msg.c_str());
  std::string detail = gma_torch_last_error();
  CHECK(has(detail, "GMA_ERR_OOM: "), "gma_torch_last_error(): %s", detail.c_str());

  /* Many failures change nothing. */
  gma_stats_t before = stats();
  int thrown = 0;
  for (int i = 0; i < 2000; i++) thrown += try_alloc(i % 2 ? 32 * MiB : 100 * MiB).what == OOM;
  gma_stats_t after = stats();
  CHECK(thrown == 2000, "%d of 2000 failures threw OutOfMemoryError", thrown);
  CHECK(after.num_allocs == before.num_allocs, "num_allocs %llu -> %llu",
        (unsigned long long)before.num_allocs, (unsigned long long)after.num_allocs);
  CHECK(after.allocated.current == before.allocated.current, "allocated %llu -> %llu",
        (unsigned long long)before.allocated.current,
        (unsigned long long)after.allocated.current);
  CHECK(after.reserved.current <= 64 * MiB && after.reserved.current <= before.reserved.current,
        "reserved %llu -> %llu", (unsigned long long)before.reserved.current,
        (unsigned long long)after.reserved.current);
  CHECK(after.num_ooms >= before.num_ooms + 1000, "num_ooms %llu -> %llu",
        (unsigned long long)before.num_ooms, (unsigned long long)after.num_ooms);

  /* Usable afterwards: the same request succeeds once the holder is freed. */
  gma_torch_shim_free(hold.ptr, 48 * MiB, 0, nullptr);
  outcome again = try_alloc(32 * MiB);
  CHECK(again.what == NONE && again.ptr, "32 MiB after freeing 48: %s", again.msg.c_str());
  gma_torch_shim_free(again.ptr, 32 * MiB, 0, nullptr);
  CHECK(stats().allocated.current == 0, "allocated bytes left: %llu",
        (unsigned long long)stats().allocated.current);

  /* Not memory: c10::Error, not OutOfMemoryError. */
  outcome bad = try_alloc(4096, -1);
  CHECK(bad.what == ERROR, "device -1: expected c10::Error (got %d)", bad.what);
  CHECK(has(bad.msg, "gma: allocating 4096 bytes on device -1 failed") &&
            has(bad.msg, "out of range"),
        "%s", bad.msg.c_str());

  gma_torch_shutdown(); /* what the plug-in's atexit handler runs */
  outcome late = try_alloc(4096);
  CHECK(late.what == ERROR && has(late.msg, "after gma_torch_shutdown"),
        "after shutdown: expected c10::Error (got %d: %s)", late.what, late.msg.c_str());

  if (failures) {
    std::fprintf(stderr, "test_torch_oom: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("test_torch_oom: OutOfMemoryError with gma's message, nothing leaked or "
              "counted by 2000 failures, allocator usable afterwards\n");
  return 0;
}
