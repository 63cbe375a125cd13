/* The simulated device's memory: device allocations (mem_alloc, mem_free,
 * mem_info), address reservations and their mappings (the vm_* calls of
 * growable segments) and pinned host memory.
 *
 * Memory comes from mmap(MAP_NORESERVE), so untouched bytes cost nothing and a
 * trace larger than the machine's memory replays; capacity is enforced by
 * accounting, so OOM happens for real. mem_mu guards every table here and is
 * a leaf lock. */
#include <errno.h>
#include <sys/mman.h>

#include "device/sim_internal.h"
#include "base/lock.h"

/* ---------------------------------------------------------------------------
 * Memory
 * ------------------------------------------------------------------------- */
#if defined(GMA_DEBUG) && GMA_DEBUG >= 2
/* Checks the memory invariant; caller holds mem_mu. */
static bool mem_is_valid(const sim_device_t *dev) {
  uint64_t sum = 0;
  size_t n = 0;
  for (size_t i = 0; i <= dev->allocs.mask; i++) {
    for (const sim_link_t *l = dev->allocs.buckets[i]; l; l = l->next, n++) {
      sum += ((const sim_alloc_t *)l)->size;
    }
  }
  size_t k = 0;
  for (size_t i = 0; i <= dev->kept.mask; i++)
    for (const sim_link_t *l = dev->kept.buckets[i]; l; l = l->next, k++)
      sum += ((const sim_alloc_t *)l)->size;
  return sum + dev->reserving == dev->used && n == dev->allocs.count && k == dev->kept.count &&
         dev->used <= dev->capacity;
}
#define SIM_MEM_CHECK(dev) assert(mem_is_valid(dev))
#else
#define SIM_MEM_CHECK(dev) ((void)0)
#endif

/* Any thread. Blocks for the configured allocation latency. */
gma_status_t gma__sim_mem_alloc(gma__device_t *d, uint64_t size, uintptr_t *out) {
  sim_device_t *dev = sim_of(d);
  gma__sim_spin_ns(dev->alloc_ns);
  uint64_t t;
  if (gma__sim_fault_fires(&dev->alloc_calls, dev->fail_alloc, &t)) {
    return gma__set_error(GMA_ERR_DEVICE, "injected failure of device allocation #%llu on the simulated device",
                          (unsigned long long)t);
  }
  sim_pay_mem(dev, GMA__SIM_COST_MEM_ALLOC, size, size);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_MEM_ALLOC);
  if (fst != GMA_OK) return fst;
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked to allocate without an address to return");
  if (size == 0) return gma__set_error(GMA_ERR_INVALID_SIZE, "the simulated device cannot allocate 0 bytes");
  sim_alloc_t *a = malloc(sizeof *a);
  if (!a) return gma__set_error(GMA_ERR_DEVICE, "the simulated device ran out of host memory for an allocation record");
  /* Capacity is reserved before mmap and given back on failure, so two
   * concurrent allocations can never both fit into the same free bytes. */
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  uint64_t used = dev->used;
  bool fits = size <= dev->capacity - used;
  if (fits) {
    dev->used += size;
    dev->reserving += size;
  }
  gma__unlock(&dev->mem_mu);
  if (!fits) {
    free(a);
    return gma__set_error(GMA_ERR_OOM,
                          "the simulated device is out of memory: requested %llu bytes, %llu of %llu "
                          "bytes in use (%llu free)",
                          (unsigned long long)size, (unsigned long long)used,
                          (unsigned long long)dev->capacity,
                          (unsigned long long)(dev->capacity - used));
  }
  void *p = size > SIZE_MAX ? MAP_FAILED
                            : mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  int err = errno;
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  dev->reserving -= size;
  if (p == MAP_FAILED) {
    dev->used -= size;
  } else {
    a->link.key = (uintptr_t)p;
    a->vm = false;
    a->size = size;
    gma__sim_table_insert(&dev->allocs, &a->link);
  }
  SIM_MEM_CHECK(dev);
  gma__unlock(&dev->mem_mu);
  if (p == MAP_FAILED) {
    free(a);
    return gma__set_error(GMA_ERR_OOM, "the simulated device could not map %llu bytes of host memory: %s",
                          (unsigned long long)size, strerror(err));
  }
  *out = (uintptr_t)p;
  return GMA_OK;
}

/* Any thread. Blocks for the configured free latency. An unknown address or a
 * size other than the allocated one changes nothing and returns GMA_ERR_DEVICE,
 * as a real driver would refuse it. */
gma_status_t gma__sim_mem_free(gma__device_t *d, uintptr_t addr, uint64_t size) {
  sim_device_t *dev = sim_of(d);
  gma__sim_spin_ns(dev->free_ns);
  sim_wait_device(dev);
  sim_pay_mem(dev, GMA__SIM_COST_MEM_FREE, size, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_MEM_FREE);
  if (fst != GMA_OK) return fst;
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  sim_alloc_t *a = (sim_alloc_t *)gma__sim_table_find(&dev->allocs, addr);
  if (a && a->vm) {
    gma__unlock(&dev->mem_mu);
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot free 0x%llx as an allocation: it is a mapping of a "
                          "growable segment",
                          (unsigned long long)addr);
  }
  uint64_t real = a ? a->size : 0;
  if (a && real == size) {
    gma__sim_table_remove(&dev->allocs, addr);
    dev->used -= size;
  }
  SIM_MEM_CHECK(dev);
  gma__unlock(&dev->mem_mu);
  if (!a) {
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot free 0x%llx (%llu bytes): not a live device "
                          "allocation",
                          (unsigned long long)addr, (unsigned long long)size);
  }
  if (real != size) {
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot free 0x%llx with size %llu: it was allocated "
                          "with %llu bytes; nothing freed",
                          (unsigned long long)addr, (unsigned long long)size,
                          (unsigned long long)real);
  }
  munmap((void *)addr, (size_t)size);
  free(a);
  return GMA_OK;
}

/* Any thread; never blocks beyond mem_mu. */
gma_status_t gma__sim_mem_info(gma__device_t *d, uint64_t *free_bytes, uint64_t *total_bytes) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_MEM_INFO, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_MEM_INFO);
  if (fst != GMA_OK) return fst;
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  uint64_t used = dev->used;
  gma__unlock(&dev->mem_mu);
  if (free_bytes) *free_bytes = dev->capacity - used;
  if (total_bytes) *total_bytes = dev->capacity;
  return GMA_OK;
}

/* ---------------------------------------------------------------------------
 * Virtual memory (growable segments): a reservation is PROT_NONE address
 * space; vm_map maps read-write pages over part of it (MAP_FIXED) and charges
 * the capacity; vm_unmap puts PROT_NONE back, which drops the pages, so a
 * kernel still touching unmapped memory faults as it would on a GPU.
 * ------------------------------------------------------------------------- */
gma_status_t gma__sim_vm_granularity(gma__device_t *d, uint64_t *bytes) {
  sim_device_t *dev = sim_of(d);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_VM_GRANULARITY);
  if (fst != GMA_OK) return fst;
  if (!bytes) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked for its granularity without a place for it");
  *bytes = SIM_VM_GRANULARITY;
  return GMA_OK;
}

static bool vm_aligned(uint64_t x) { return x % SIM_VM_GRANULARITY == 0; }

/* Any thread. */
gma_status_t gma__sim_vm_reserve(gma__device_t *d, uint64_t size, uintptr_t *out) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_VM_RESERVE, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_VM_RESERVE);
  if (fst != GMA_OK) return fst;
  if (!out) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked to reserve without an address to return");
  if (size == 0 || !vm_aligned(size) || size > (1ull << 46))
    return gma__set_error(GMA_ERR_INVALID_SIZE,
                          "the simulated device cannot reserve %llu bytes of address space: not a "
                          "nonzero multiple of the granularity (%llu) below 64 TiB",
                          (unsigned long long)size, SIM_VM_GRANULARITY);
  sim_reserve_t *r = calloc(1, sizeof *r);
  uint8_t *mapped = calloc((size_t)(size / SIM_VM_GRANULARITY), 1);
  size_t span = (size_t)(size + SIM_VM_GRANULARITY);
  void *p = r && mapped ? mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                               -1, 0)
                        : MAP_FAILED;
  if (p == MAP_FAILED) {
    free(r);
    free(mapped);
    return gma__set_error(GMA_ERR_OOM, "the simulated device cannot reserve %llu bytes of address space",
                          (unsigned long long)size);
  }
  /* Keep the aligned part; give the slop on either side back. */
  uintptr_t raw = (uintptr_t)p, base = (raw + SIM_VM_GRANULARITY - 1) & ~(SIM_VM_GRANULARITY - 1);
  if (base > raw) munmap(p, base - raw);
  if (raw + span > base + size) munmap((void *)(base + size), raw + span - (base + size));
  r->link.key = base;
  r->size = size;
  r->mapped = mapped;
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  gma__sim_table_insert(&dev->reserves, &r->link);
  gma__unlock(&dev->mem_mu);
  *out = base;
  return GMA_OK;
}

/* The reservation holding [addr, addr + size), or NULL; caller holds mem_mu.
 * Reservations are few (one per pool), so a scan is fine. */
static sim_reserve_t *reserve_of(const sim_device_t *dev, uintptr_t addr, uint64_t size) {
  for (size_t i = 0; i <= dev->reserves.mask; i++)
    for (sim_link_t *l = dev->reserves.buckets[i]; l; l = l->next) {
      sim_reserve_t *r = (sim_reserve_t *)l;
      if (addr >= l->key && size <= r->size && addr - l->key <= r->size - size) return r;
    }
  return NULL;
}

/* Any thread. */
gma_status_t gma__sim_vm_release(gma__device_t *d, uintptr_t addr, uint64_t size) {
  sim_device_t *dev = sim_of(d);
  sim_pay(dev, GMA__SIM_COST_VM_RELEASE, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_VM_RELEASE);
  if (fst != GMA_OK) return fst;
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  sim_reserve_t *r = (sim_reserve_t *)gma__sim_table_find(&dev->reserves, addr);
  bool ok = r && r->size == size && r->nmapped == 0;
  if (ok) gma__sim_table_remove(&dev->reserves, addr);
  gma__unlock(&dev->mem_mu);
  if (!ok)
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot release the range 0x%llx (%llu bytes): %s", (unsigned long long)addr,
                          (unsigned long long)size,
                          !r ? "not a reservation"
                             : r->size != size ? "size differs from the reservation's"
                                               : "parts of it are still mapped");
  munmap((void *)addr, (size_t)size);
  free(r->mapped);
  free(r);
  return GMA_OK;
}

/* Any thread. Blocks for the configured allocation latency; counts as a
 * device allocation for fault injection. */
gma_status_t gma__sim_vm_map(gma__device_t *d, uintptr_t addr, uint64_t size, uint64_t *handle) {
  sim_device_t *dev = sim_of(d);
  gma__sim_spin_ns(dev->alloc_ns);
  uint64_t t;
  if (gma__sim_fault_fires(&dev->alloc_calls, dev->fail_alloc, &t))
    return gma__set_error(GMA_ERR_DEVICE, "injected failure of device allocation #%llu "
                                          "(vm_map) on the simulated device", (unsigned long long)t);
  sim_pay_mem(dev, GMA__SIM_COST_VM_MAP, size, size);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_VM_MAP);
  if (fst != GMA_OK) return fst;
  if (!handle) return gma__set_error(GMA_ERR_INVALID_ARGUMENT, "the simulated device was asked to map memory without a place for its handle");
  if (size == 0 || !vm_aligned(size) || !vm_aligned(addr))
    return gma__set_error(GMA_ERR_INVALID_SIZE,
                          "the simulated device cannot map %llu bytes at 0x%llx: not aligned to its "
                          "granularity",
                          (unsigned long long)size, (unsigned long long)addr);
  sim_alloc_t *a = calloc(1, sizeof *a);
  if (!a) return gma__set_error(GMA_ERR_DEVICE, "the simulated device ran out of host memory for a mapping record");
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  sim_reserve_t *r = reserve_of(dev, addr, size);
  uint64_t g0 = r ? (addr - r->link.key) / SIM_VM_GRANULARITY : 0, n = size / SIM_VM_GRANULARITY;
  bool free_range = r != NULL;
  for (uint64_t i = 0; free_range && i < n; i++) free_range = !r->mapped[g0 + i];
  uint64_t used = dev->used;
  bool fits = size <= dev->capacity - used;
  if (free_range && fits) {
    /* The map happens under mem_mu, so a concurrent unmap of a neighbour
     * (also under mem_mu) cannot interleave with it. */
    void *p = mmap((void *)addr, (size_t)size, PROT_READ | PROT_WRITE,
                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      fits = false;
    } else {
      memset(r->mapped + g0, 1, (size_t)n);
      r->nmapped += n;
      dev->used += size;
      a->link.key = addr;
      a->size = size;
      a->vm = true;
      a->handle = ++dev->next_handle;
      gma__sim_table_insert(&dev->allocs, &a->link);
    }
  }
  SIM_MEM_CHECK(dev);
  gma__unlock(&dev->mem_mu);
  if (!free_range) {
    free(a);
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot map 0x%llx (%llu bytes): %s", (unsigned long long)addr,
                          (unsigned long long)size,
                          r ? "part of the range is already mapped" : "not inside a reservation");
  }
  if (!fits) {
    free(a);
    return gma__set_error(GMA_ERR_OOM,
                          "the simulated device is out of memory: mapping %llu bytes, %llu of %llu "
                          "bytes in use",
                          (unsigned long long)size, (unsigned long long)used,
                          (unsigned long long)dev->capacity);
  }
  *handle = a->handle;
  return GMA_OK;
}

/* Takes vm mapping a out of allocs and its reservation and puts PROT_NONE
 * back over it, which drops its pages; mem_mu held (see vm_map). */
static void unmap_locked(sim_device_t *dev, sim_alloc_t *a) {
  uintptr_t addr = a->link.key;
  sim_reserve_t *r = reserve_of(dev, addr, a->size);
  SIM_ASSERT(r);
  memset(r->mapped + (addr - r->link.key) / SIM_VM_GRANULARITY, 0,
         (size_t)(a->size / SIM_VM_GRANULARITY));
  r->nmapped -= a->size / SIM_VM_GRANULARITY;
  gma__sim_table_remove(&dev->allocs, addr);
  mmap((void *)addr, (size_t)a->size, PROT_NONE,
       MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
}

/* Unmaps exactly one mapping of handle at addr; its physical memory is
 * freed, or with keep kept under the handle (still counted as used) for
 * vm_map_kept or vm_free_kept. The contents are not kept (a GPU's are, but
 * gma never relies on them). */
static gma_status_t unmap_one(sim_device_t *dev, uintptr_t addr, uint64_t size, uint64_t handle,
                              bool keep) {
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  sim_alloc_t *a = (sim_alloc_t *)gma__sim_table_find(&dev->allocs, addr);
  bool ok = a && a->vm && a->size == size && a->handle == handle;
  if (ok) {
    unmap_locked(dev, a);
    if (keep) {
      a->link.key = handle;
      gma__sim_table_insert(&dev->kept, &a->link);
    } else {
      dev->used -= size;
    }
  }
  SIM_MEM_CHECK(dev);
  gma__unlock(&dev->mem_mu);
  if (!ok)
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot unmap 0x%llx (%llu bytes)%s: not exactly "
                          "one earlier mapping of that handle",
                          (unsigned long long)addr, (unsigned long long)size,
                          keep ? " and keep its memory" : "");
  if (!keep) free(a);
  return GMA_OK;
}

/* Any thread. Blocks for the configured free latency. */
gma_status_t gma__sim_vm_unmap(gma__device_t *d, uintptr_t addr, uint64_t size, uint64_t handle) {
  sim_device_t *dev = sim_of(d);
  gma__sim_spin_ns(dev->free_ns);
  sim_pay_mem(dev, GMA__SIM_COST_VM_UNMAP, size, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_VM_UNMAP);
  return fst != GMA_OK ? fst : unmap_one(dev, addr, size, handle, false);
}

/* Any thread. */
gma_status_t gma__sim_vm_unmap_keep(gma__device_t *d, uintptr_t addr, uint64_t size,
                                    uint64_t handle) {
  sim_device_t *dev = sim_of(d);
  sim_pay_mem(dev, GMA__SIM_COST_VM_UNMAP_KEEP, size, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_VM_UNMAP_KEEP);
  return fst != GMA_OK ? fst : unmap_one(dev, addr, size, handle, true);
}

/* Any thread. Maps the kept physical memory named handle, all size bytes of
 * it, at addr (inside a reservation, not mapped); no new memory. */
gma_status_t gma__sim_vm_map_kept(gma__device_t *d, uintptr_t addr, uint64_t size,
                                  uint64_t handle) {
  sim_device_t *dev = sim_of(d);
  sim_pay_mem(dev, GMA__SIM_COST_VM_MAP_KEPT, size, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_VM_MAP_KEPT);
  if (fst != GMA_OK) return fst;
  if (!vm_aligned(addr) || !vm_aligned(size) || size == 0)
    return gma__set_error(GMA_ERR_INVALID_SIZE,
                          "the simulated device cannot map %llu bytes at 0x%llx: not aligned to its "
                          "granularity",
                          (unsigned long long)size, (unsigned long long)addr);
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  sim_alloc_t *k = (sim_alloc_t *)gma__sim_table_find(&dev->kept, handle);
  sim_reserve_t *r = k && k->size == size ? reserve_of(dev, addr, size) : NULL;
  uint64_t g0 = r ? (addr - r->link.key) / SIM_VM_GRANULARITY : 0, n = size / SIM_VM_GRANULARITY;
  bool free_range = r != NULL;
  for (uint64_t i = 0; free_range && i < n; i++) free_range = !r->mapped[g0 + i];
  bool mapped = free_range && mmap((void *)addr, (size_t)size, PROT_READ | PROT_WRITE,
                                   MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                                   0) != MAP_FAILED;
  if (mapped) {
    gma__sim_table_remove(&dev->kept, handle);
    memset(r->mapped + g0, 1, (size_t)n);
    r->nmapped += n;
    k->link.key = addr;
    gma__sim_table_insert(&dev->allocs, &k->link);
  }
  SIM_MEM_CHECK(dev);
  gma__unlock(&dev->mem_mu);
  if (!mapped)
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot map kept memory 0x%llx (%llu bytes) at "
                          "0x%llx: %s",
                          (unsigned long long)handle, (unsigned long long)size,
                          (unsigned long long)addr,
                          !k ? "no such kept handle"
                          : k->size != size ? "its size differs"
                          : !free_range ? "the range is not a free part of a reservation"
                                        : "the host refused the pages");
  return GMA_OK;
}

/* Any thread. Frees kept physical memory (not mapped anywhere). */
gma_status_t gma__sim_vm_free_kept(gma__device_t *d, uint64_t handle, uint64_t size) {
  sim_device_t *dev = sim_of(d);
  sim_pay_mem(dev, GMA__SIM_COST_VM_FREE_KEPT, size, 0);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_VM_FREE_KEPT);
  if (fst != GMA_OK) return fst;
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  sim_alloc_t *k = (sim_alloc_t *)gma__sim_table_find(&dev->kept, handle);
  bool ok = k && k->size == size;
  if (ok) {
    gma__sim_table_remove(&dev->kept, handle);
    dev->used -= size;
  }
  SIM_MEM_CHECK(dev);
  gma__unlock(&dev->mem_mu);
  if (!ok)
    return gma__set_error(GMA_ERR_DEVICE,
                          "the simulated device cannot free kept memory 0x%llx (%llu bytes): %s",
                          (unsigned long long)handle, (unsigned long long)size,
                          k ? "its size differs" : "no such kept handle");
  free(k);
  return GMA_OK;
}

/* ---------------------------------------------------------------------------
 * Host memory: ordinary anonymous memory (the simulated device reads host
 * memory anyway), so the device address is the host address. Each block is
 * recorded in dev->hosts, so a free of anything else is refused (as a driver
 * would) and destroy gives back what is left.
 * ------------------------------------------------------------------------- */
gma_status_t gma__sim_host_alloc(gma__device_t *d, uint64_t size, void **host,
                                   uintptr_t *dev_addr) {
  sim_device_t *dev = sim_of(d);
  sim_wait_device(dev);
  sim_pay(dev, GMA__SIM_COST_HOST_ALLOC, size);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_HOST_ALLOC);
  if (fst != GMA_OK) return fst;
  sim_alloc_t *a = malloc(sizeof *a);
  void *p = a && size && size <= SIZE_MAX
                ? mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0)
                : MAP_FAILED;
  if (p == MAP_FAILED) {
    free(a);
    return gma__set_error(GMA_ERR_OOM, "the simulated device has no host memory for %llu pinned bytes",
                          (unsigned long long)size);
  }
  a->link.key = (uintptr_t)p;
  a->size = size;
  a->vm = false;
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  gma__sim_table_insert(&dev->hosts, &a->link);
  dev->host_bytes += size;
  gma__unlock(&dev->mem_mu);
  *host = p;
  *dev_addr = (uintptr_t)p;
  return GMA_OK;
}

/* Any thread. An unknown address or another size changes nothing. */
gma_status_t gma__sim_host_free(gma__device_t *d, void *host, uint64_t size) {
  sim_device_t *dev = sim_of(d);
  sim_wait_device(dev);
  sim_pay(dev, GMA__SIM_COST_HOST_FREE, size);
  gma_status_t fst = gma__sim_site_fault(dev, GMA__SIM_HOST_FREE);
  if (fst != GMA_OK) return fst;
  gma__lock(&dev->mem_mu, GMA__RANK_SIM_MEM);
  sim_alloc_t *a = (sim_alloc_t *)gma__sim_table_find(&dev->hosts, (uintptr_t)host);
  bool ok = a && a->size == size;
  if (ok) {
    gma__sim_table_remove(&dev->hosts, (uintptr_t)host);
    dev->host_bytes -= size;
  }
  gma__unlock(&dev->mem_mu);
  if (!ok)
    return gma__set_error(GMA_ERR_DEVICE, "the simulated device cannot free pinned memory %p (%llu bytes): %s", host,
                          (unsigned long long)size,
                          a ? "size differs from the allocation's; nothing freed"
                            : "not a live host allocation");
  munmap(host, (size_t)size);
  free(a);
  return GMA_OK;
}

/* Unmaps the memory behind every device allocation, address reservation and
 * pinned host block, and frees their tables: the device's destroy, and its
 * forget in a fork() child. mem_mu held, or no other thread left. */
void gma__sim_release_memory(sim_device_t *dev) {
  sim_link_t *l;
  while ((l = gma__sim_table_pop(&dev->allocs))) {
    munmap((void *)l->key, (size_t)((sim_alloc_t *)l)->size);
    free(l);
  }
  while ((l = gma__sim_table_pop(&dev->reserves))) {
    munmap((void *)l->key, (size_t)((sim_reserve_t *)l)->size);
    free(((sim_reserve_t *)l)->mapped);
    free(l);
  }
  while ((l = gma__sim_table_pop(&dev->hosts))) {
    munmap((void *)l->key, (size_t)((sim_alloc_t *)l)->size);
    free(l);
  }
  while ((l = gma__sim_table_pop(&dev->kept))) free(l); /* no pages: not mapped */
  free(dev->allocs.buckets);
  free(dev->kept.buckets);
  free(dev->reserves.buckets);
  free(dev->hosts.buckets);
}

