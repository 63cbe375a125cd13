/* The one wrapper for atomics: every name carries its memory order, so a
 * reader sees the ordering at the call site. C11 <stdatomic.h> underneath;
 * ck_pr is used only inside ck's own structures (ck_stack), never on the same
 * object as these (design.md, convention 5). Fields written concurrently are
 * declared _Atomic; every release names the acquire it pairs with. */
#ifndef GMA_ATOMICS_H
#define GMA_ATOMICS_H

#include <sched.h>
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

/* Sequentially consistent: where two threads each store one thing and load
 * the other's (a Dekker pair), and where a weaker order has not been argued
 * next to the data. */
#define gma__load_seq_cst(p) atomic_load_explicit((p), memory_order_seq_cst)
#define gma__store_seq_cst(p, v) atomic_store_explicit((p), (v), memory_order_seq_cst)
#define gma__exchange_seq_cst(p, v) atomic_exchange_explicit((p), (v), memory_order_seq_cst)
#define gma__faa_seq_cst(p, v) atomic_fetch_add_explicit((p), (v), memory_order_seq_cst)
#define gma__fas_seq_cst(p, v) atomic_fetch_sub_explicit((p), (v), memory_order_seq_cst)
#define gma__cas_seq_cst(p, expected, desired)                                            \
  atomic_compare_exchange_strong_explicit((p), (expected), (desired), memory_order_seq_cst, \
                                          memory_order_seq_cst)
#define gma__cas_weak_seq_cst(p, expected, desired)                                     \
  atomic_compare_exchange_weak_explicit((p), (expected), (desired), memory_order_seq_cst, \
                                        memory_order_seq_cst)
/* The rest of the read-modify-writes by order. */
#define gma__exchange_relaxed(p, v) atomic_exchange_explicit((p), (v), memory_order_relaxed)
#define gma__fas_release(p, v) atomic_fetch_sub_explicit((p), (v), memory_order_release)
#define gma__cas_relaxed(p, expected, desired)                                            \
  atomic_compare_exchange_strong_explicit((p), (expected), (desired), memory_order_relaxed, \
                                          memory_order_relaxed)
#define gma__cas_weak_relaxed(p, expected, desired)                                     \
  atomic_compare_exchange_weak_explicit((p), (expected), (desired), memory_order_relaxed, \
                                        memory_order_relaxed)
/* Initializes an atomic object no other thread can see yet (no order). */
#define gma__atomic_init(p, v) atomic_init((p), (v))

/* Adds to a counter that only the calling thread writes (others only read it
 * with relaxed loads): a plain load and store, no locked instruction. */
#define gma__counter_add_owner(p, v) gma__store_relaxed((p), gma__load_relaxed(p) + (v))

/* A full (seq_cst) fence: orders every earlier load and store before every
 * later one, for a Dekker pair whose stores and loads are not all seq_cst
 * operations on the same objects. */
#define gma__fence_seq_cst() atomic_thread_fence(memory_order_seq_cst)

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

/* One step of a spin-wait for another thread of ours (the worker, or a
 * thread waiting on a future): a pause; once the spin has lasted 1 us
 * (yielding, computed by the caller), every 4th step is a sched_yield.
 * A pure spin holds the CPU the other thread may need: when the scheduler
 * put both on one CPU (it did in 1 run of 4 on the 2-core VM), each spin ran
 * out its whole budget (20 and 50 us) before the other could run, and the
 * worker's answer took 27 us instead of 0.7. The yield hands the
 * CPU over at once when the other thread is runnable there, and returns at
 * once otherwise; but each costs about 0.5 us, so the first microsecond
 * (about what an answer from another CPU takes) spins without it. Measured
 * on the 2-core VM, p50 of a forced hop on two CPUs / on one: yielding from
 * the start 0.8-1.4 / 3-5 us; after 1 us 0.55-0.7 / 5.3 us; after 2 us
 * 0.55-0.7 / 7.1 us; never 0.7 / 26.7 us. */
#define gma__spin_step(i, yielding)                 \
  do {                                              \
    if ((yielding) && (i) % 4 == 3) sched_yield(); \
    else gma__cpu_relax();                          \
  } while (0)

#endif /* GMA_ATOMICS_H */
