/* The one wrapper for atomics: every name carries its memory order, so a
 * reader sees the ordering at the call site. C11 <stdatomic.h> underneath;
 * ck_pr is used only inside ck's own structures (ck_stack), never on the same
 * object as these (design.md, convention 5). Fields written concurrently are
 * declared _Atomic; every release names the acquire it pairs with. */
#ifndef GMA_ATOMICS_H
#define GMA_ATOMICS_H

#include <stdatomic.h>
#include <stdint.h>

#define gma__load_relaxed(p) atomic_load_explicit((p), memory_order_relaxed)
#define gma__load_acquire(p) atomic_load_explicit((p), memory_order_acquire)
#define gma__store_relaxed(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define gma__store_release(p, v) atomic_store_explicit((p), (v), memory_order_release)
#define gma__faa_relaxed(p, v) atomic_fetch_add_explicit((p), (v), memory_order_relaxed)
#define gma__fas_relaxed(p, v) atomic_fetch_sub_explicit((p), (v), memory_order_relaxed)
#define gma__cas_acq_rel(p, expected, desired)                                            \
  atomic_compare_exchange_strong_explicit((p), (expected), (desired), memory_order_acq_rel, \
                                          memory_order_acquire)

/* Adds to a counter that only the calling thread writes (others only read it
 * with relaxed loads): a plain load and store, no locked instruction. */
#define gma__counter_add_owner(p, v) gma__store_relaxed((p), gma__load_relaxed(p) + (v))

/* A full fence right after a locked read-modify-write made inside ck (a
 * ck_stack_push_mpmc: a lock cmpxchg on x86), for a Dekker pair whose other side
 * is C11 seq_cst. On x86 every locked instruction is already a full fence, so
 * only the compiler is kept from moving later loads above it; elsewhere a
 * real fence is emitted. */
#if defined(__x86_64__) || defined(__i386__)
#define gma__fence_after_locked_rmw() atomic_signal_fence(memory_order_seq_cst)
#else
#define gma__fence_after_locked_rmw() atomic_thread_fence(memory_order_seq_cst)
#endif

/* A spin-wait hint (x86 pause; elsewhere a compiler barrier). */
#if defined(__x86_64__) || defined(__i386__)
#define gma__cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define gma__cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define gma__cpu_relax() __asm__ __volatile__("" ::: "memory")
#endif

#endif /* GMA_ATOMICS_H */
