/* gma: a stream-ordered GPU memory allocator runtime.
 *
 * This is the one public header. Every public name starts with gma_ or GMA_.
 * Every call that can fail returns a gma_status_t (0 success, negative error)
 * and gives results through out-parameters; gma_last_error() then says in a
 * sentence what went wrong on the calling thread.
 *
 * Threads: unless a comment says otherwise, every function taking a gma_t may
 * be called from any number of threads at once. gma_create and gma_destroy are
 * the exceptions: no other call on the same allocator may run concurrently with
 * gma_destroy, except calls on its futures (poll, wait, release).
 *
 * Structs that start with a size field (gma_config_t, gma_async_options_t,
 * gma_stats_t, gma_stream_stats_t, gma_graph_pool_stats_t,
 * gma_pointer_info_t, gma_transformer_t, gma_estimate_t) grow only at the
 * end: set size with the struct's ..._INIT macro and a program built
 * against an older gma.h keeps working, since gma reads and writes only the
 * first size bytes (fields past them count as zero, the default). A size
 * below sizeof(size_t) or above this library's struct is refused with
 * GMA_ERR_INVALID_ARGUMENT, and so is, in gma_config_parse, a key whose
 * field lies past size (GMA_ERR_CONFIG). */
#ifndef GMA_H
#define GMA_H

#include <stddef.h>
#include <stdint.h>

#include "gma/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(GMA_STATIC_BUILD)
#define GMA_API __attribute__((visibility("default")))
#else
#define GMA_API
#endif

/* ---------------------------------------------------------------------------
 * Statuses. One X-macro generates the enum, gma_status_name and gma_strerror.
 * X(name, value, what it means and what to do)
 * ------------------------------------------------------------------------- */
#define GMA_STATUS_MAP(X)                                                                     \
  X(GMA_OK, 0, "success")                                                                     \
  X(GMA_ERR_INVALID_ARGUMENT, -1,                                                             \
    "an argument is invalid (a NULL handle or out-parameter, or a value out of range); "      \
    "see gma_last_error() for which one")                                                     \
  X(GMA_ERR_INVALID_SIZE, -2,                                                                 \
    "the size is zero or larger than the device could ever provide; ask for 1 byte or more, " \
    "within the device's capacity or the configured memory_limit")                            \
  X(GMA_ERR_OOM, -3,                                                                          \
    "out of device memory after releasing every cached block that was safe to release; "     \
    "free memory, lower the request, or raise memory_limit")                                  \
  X(GMA_ERR_INVALID_POINTER, -4,                                                              \
    "the pointer was not returned by this allocator (foreign or interior pointer, or the "    \
    "other kind of memory); pass exactly the pointer gma_alloc gave you to gma_free")         \
  X(GMA_ERR_DOUBLE_FREE, -5,                                                                  \
    "the pointer is not live: it was already freed; free each allocation once")               \
  X(GMA_ERR_CONFIG, -6,                                                                       \
    "the configuration is invalid (unknown key or bad value in GMA_CONF or gma_config_t); "   \
    "see gma_last_error() and docs/config.md")                              \
  X(GMA_ERR_DEVICE, -7,                                                                       \
    "a device call failed; gma_last_error() carries the device's own message")                \
  X(GMA_ERR_NO_DEVICE, -8,                                                                    \
    "the requested device backend is not available on this machine or in this build; "       \
    "use device:sim or device:auto")                                                          \
  X(GMA_ERR_UNSUPPORTED, -9, "the operation is not supported by this allocator's device")    \
  X(GMA_ERR_LEAK, -10,                                                                        \
    "the allocator was destroyed with live allocations; gma freed them, gma_last_error() "    \
    "says how many and how large")                                                            \
  X(GMA_ERR_INTERNAL, -11,                                                                    \
    "an internal invariant was violated; this is a bug in gma, please report it with "        \
    "gma_last_error()")                                                                       \
  X(GMA_ERR_TIMEOUT, -12,                                                                     \
    "the deadline passed before memory became free (an async request waited for frees "       \
    "that did not come); free memory, raise the timeout, or ask for less")                    \
  X(GMA_ERR_BUSY, -13,                                                                        \
    "the request ring is full and the call was asked not to block; retry later, or submit "  \
    "with nonblocking off")                                                                   \
  X(GMA_ERR_CANCELLED, -14,                                                                   \
    "the allocator was destroyed before the async request was served")                        \
  X(GMA_ERR_ALREADY_COLLECTED, -15,                                                           \
    "an earlier gma_future_wait already took this future's memory (one wait, on any thread, " \
    "gets the pointer); use the pointer that wait returned")                                   \
  X(GMA_PENDING, 1, "the future is not complete yet (not an error)")

typedef enum gma_status {
#define GMA_STATUS_ENUM_(name, value, text) name = value,
  GMA_STATUS_MAP(GMA_STATUS_ENUM_)
#undef GMA_STATUS_ENUM_
} gma_status_t;

/* "GMA_ERR_OOM" for GMA_ERR_OOM; "GMA_UNKNOWN_STATUS" for values outside the map.
 * Any thread; wait-free. */
GMA_API const char *gma_status_name(gma_status_t status);
/* What the status means and what to do about it, one sentence. Any thread; wait-free. */
GMA_API const char *gma_strerror(gma_status_t status);
/* The detail of the last failing gma call on the calling thread (sizes, stream,
 * what was reserved and free at an OOM); "" if no call on this thread failed yet.
 * The text stays valid until the next failing gma call on this thread. */
GMA_API const char *gma_last_error(void);
/* The library's version, "major.minor.patch". Any thread; wait-free. */
GMA_API const char *gma_version(void);

/* ---------------------------------------------------------------------------
 * Configuration. Every field's zero means "the default", so GMA_CONFIG_INIT
 * only sets the size; later versions append fields without breaking callers.
 * GMA_CONF="key:value,key:value" in the environment overrides the struct at
 * gma_create (unless ignore_env is set); docs/config.md lists the keys.
 * ------------------------------------------------------------------------- */
typedef enum gma_device_kind {
  GMA_DEVICE_AUTO = 0, /* CUDA if a driver loads and this build has the backend, else sim */
  GMA_DEVICE_SIM = 1,  /* the simulated device: host memory, host-thread streams */
  GMA_DEVICE_CUDA = 2  /* the CUDA driver; gma_create fails with GMA_ERR_NO_DEVICE without it */
} gma_device_kind_t;

/* Cross-stream reuse: when may a block freed on stream S serve stream U? */
typedef enum gma_reuse {
  GMA_REUSE_AUTO = 0,  /* as QUERY, and a block freed after gma_record_stream(ptr, U) for
                          one stream U serves U before that, when that saves growing the
                          pool: U waits on S's event on the device (U already waited for
                          S's work on the block); S itself takes back its blocks that
                          wait for other streams' work, behind a device-side wait on
                          them, once they hold as much as is allocated (the host is a
                          working set ahead; a program whose work on a recorded block
                          can wait for that thread's later work, a stream held on the
                          host or a peer's NCCL call, must use QUERY: docs/streams.md);
                          ordinary segments serve the stream that made them first
                          (default) */
  GMA_REUSE_WAIT = 1,  /* as AUTO, and also before that: U is made to wait on S's event
                          on the device (no host blocking), when that saves growing the
                          pool (a block cached on S, alone or joined with the free memory
                          beside it); a block freed after gma_record_stream too, U then
                          waiting on the event of S and of every recorded stream */
  GMA_REUSE_NONE = 2,  /* never automatically: S keeps its freed blocks until
                          gma_empty_cache or gma_stream_retire */
  GMA_REUSE_QUERY = 3  /* once the host has seen S's work on it complete (no device-side
                          wait ever) */
} gma_reuse_t;

typedef struct gma_config {
  size_t size;                 /* sizeof(gma_config_t) as the caller compiled it */
  gma_device_kind_t device;    /* GMA_CONF key "device": auto | sim | cuda */
  int device_ordinal;          /* "device_id": which GPU (default 0; 0..1023) */
  int ignore_env;              /* nonzero: do not read GMA_CONF */
  uint64_t memory_limit;       /* "memory_limit": most bytes gma reserves; 0 = the device's;
                                  else 1M..1024T */
  uint64_t small_size;         /* "small_size": requests up to this use the small pool
                                  (1 MiB; 512..64M) */
  uint64_t small_segment_size; /* "small_segment": segment size of the small pool (2 MiB;
                                  a multiple of 512, small_size..1G) */
  uint64_t large_segment_size; /* "large_segment": segment shared by large requests below
                                  10 MiB (20 MiB; a multiple of 2M, up to 64G) */
  gma_reuse_t reuse;           /* "reuse": auto | query | wait | none */
  uint64_t bin_max;            /* "bin_max": largest request served by the lock-free
                                  per-stream bins (1 MiB; 512..1G) */
  uint64_t bin_depth;          /* "bin_depth": most blocks one bin holds (64; 1..65536) */
  int bins_off;                /* "bins": on | off (off: every call goes to the pool) */
  /* Simulated device (ignored by CUDA). */
  uint64_t sim_capacity;         /* "sim_capacity": device memory in bytes (80 GiB; 1M..1024T) */
  uint64_t sim_alloc_latency_ns; /* "sim_alloc_ns": time one device allocation takes (0) */
  uint64_t sim_free_latency_ns;  /* "sim_free_ns": time one device free takes (0) */
  uint64_t sim_event_latency_ns; /* "sim_event_ns": time one event record/query takes (0) */
  uint64_t sim_fail_alloc;       /* "sim_fail_alloc": fail the Nth device allocation (1-based) */
  uint64_t sim_fail_event;       /* "sim_fail_event": fail the Nth event call (1-based) */
  /* The worker thread: growth ahead of demand and timed trimming. */
  uint64_t trim_interval_ms;     /* "trim_interval_ms": timed trimming period (1000; 1..3600000) */
  uint64_t release_threshold;    /* "release_threshold": cache (reserved - allocated) timed
                                    trimming keeps. 0 (text "auto", the default): keep the
                                    working set, trim only idle memory and what pressure from
                                    outside gma calls for; GMA_RELEASE_ALL (text "0"): keep
                                    nothing; else the bytes to keep (512..1024T) */
  uint64_t idle_ms;              /* "idle_ms": free segments idle longer than this are given
                                    back by timed trimming (10000; 1..86400000) */
  uint64_t grow_ahead;           /* "grow_ahead": free pool bytes the worker keeps ready
                                    (0 = none, the default) */
  int worker_off;                /* "worker": on | off (off: no thread, no timed trimming,
                                    and async requests fail with GMA_ERR_UNSUPPORTED) */
  uint64_t ring_size;            /* "ring_size": async request ring slots (1024; a power of
                                    2, 2..1048576); it holds ring_size - 1 requests.
                                    Submits from callbacks on the worker thread do not
                                    wait for it (gma_future_callback_t) */
  uint64_t future_timeout_ms;    /* "future_timeout_ms": default time an async request waits
                                    for memory (1000; 1..86400000) */
  /* Growable segments: one reserved address range per pool, physical chunks
   * of the device's granularity mapped in as the pool grows and unmapped by
   * trimming, so neighbouring blocks coalesce across chunks. The default
   * (auto) uses them wherever the device supports virtual memory management,
   * the memory limit holds one chunk and the address range can be reserved,
   * else ordinary segments (one device allocation each); true insists on
   * them (gma_create fails where they are impossible); false selects
   * ordinary segments.
   * gma_stats' address_ranges says which a pool got. */
  int expandable_segments;       /* "expandable_segments": auto | true | false (auto);
                                    gma_segments_t */
  /* Trace recording from gma_create on (see gma_trace_start); "" = off. */
  char trace_path[512];          /* "trace": a file path (the value runs to the next comma) */
  /* CPU fallback: when device memory is exhausted even after releasing cache
   * and retrying, serve the request from pinned host memory mapped into the
   * device's address space instead of failing (gma_pointer_info says so). */
  int fallback_host;             /* "fallback": none | host (none) */
  uint64_t host_release_threshold; /* "host_release_threshold": free pinned host memory
                                      the worker's timed trim keeps (64M; 0 = default) */
  /* Before gma_alloc or gma_alloc_batch fails with GMA_ERR_OOM, it waits on
   * the host for device work that still uses freed memory, then retries. */
  uint64_t oom_wait_ms;          /* "oom_wait_ms": the most it waits (0 = as long as such
                                    work is outstanding; else 1..86400000) */
  /* What a NULL stream means: the legacy default stream (0, the default),
   * or, for programs built with nvcc --default-stream per-thread, the calling
   * thread's own default stream (1: every NULL is GMA_STREAM_PER_THREAD). */
  int per_thread_default_stream; /* "default_stream": legacy | per_thread (legacy) */
  /* Planned memory for repeating workloads (gma_iteration_mark): gma learns
   * one iteration's allocations, places them in one arena off the hot path,
   * and serves later iterations from the plan. */
  int plan;                      /* "plan": off | on (off) */
  /* The simulated device's GPU cost model (ignored by CUDA): each device
   * call takes the host time it takes on that GPU, frees wait for the
   * device's queued work, and an event behind work completes after it
   * (docs/gpu/cost-model.md). 0 (none): calls cost only the sim_*_ns knobs. */
  int sim_costs;                 /* "sim_costs": none | h100 | h200 (none) */
} gma_config_t;

/* release_threshold = GMA_RELEASE_ALL (GMA_CONF "release_threshold:0"): every
 * tick gives back all free memory, as cudaMemPoolAttrReleaseThreshold = 0
 * does at each synchronization. (In the struct, 0 means the default, "auto",
 * as it does for every field.) */
#define GMA_RELEASE_ALL UINT64_MAX

/* Designated in C (and C++20) so -Wextra stays quiet about the other fields. */
#if defined(__cplusplus) && __cplusplus < 202002L
#define GMA_CONFIG_INIT {sizeof(gma_config_t)}
#else
#define GMA_CONFIG_INIT {.size = sizeof(gma_config_t)}
#endif

/* gma_config_t.expandable_segments: which segments a pool grows by. */
typedef enum gma_segments {
  GMA_SEGMENTS_AUTO = 0,     /* growable where the device supports them (the default) */
  GMA_SEGMENTS_GROWABLE = 1, /* "true": growable, or gma_create fails */
  GMA_SEGMENTS_ORDINARY = 2  /* "false": one device allocation per segment */
} gma_segments_t;

/* Applies "key:value,key:value" to *config, as GMA_CONF does. Sizes are digits
 * with an optional K, M, G or T (powers of 1024) and then an optional B or iB.
 * The resulting config is checked whole, as gma_create would (zero fields are
 * the defaults): ranges, ring_size a power of 2, segment sizes against
 * small_size and memory_limit; only checks that need the device are left to
 * gma_create. Unknown keys and bad values give GMA_ERR_CONFIG with the
 * offending key in gma_last_error(); *config is then left unchanged. Only
 * config->size bytes are read and written; a size gma_create refuses is
 * refused here too (GMA_ERR_INVALID_ARGUMENT), and a key whose field lies
 * past config->size (an older gma.h's struct) gives GMA_ERR_CONFIG. Any
 * thread, on distinct configs. */
GMA_API gma_status_t gma_config_parse(gma_config_t *config, const char *text);

/* ---------------------------------------------------------------------------
 * CUDA devices. The driver (libcuda.so.1, or the file named by the environment
 * variable GMA_CUDA_DRIVER) is loaded at run time on first use; a machine
 * without it runs the simulated device.
 * ------------------------------------------------------------------------- */
/* Number of CUDA devices the driver reports. GMA_ERR_NO_DEVICE, with *count
 * set to 0, when no driver loads, it reports an error, or this build has no
 * CUDA backend; gma_last_error() says which. Any thread. */
GMA_API gma_status_t gma_device_count(int *count);
/* The CUDA device with the most free memory among those with at least size
 * bytes free, for config.device_ordinal. GMA_ERR_OOM when no device has size
 * bytes free; GMA_ERR_NO_DEVICE as for gma_device_count. Any thread. */
GMA_API gma_status_t gma_select_device(size_t size, int *device);

/* ---------------------------------------------------------------------------
 * Memory estimate of a transformer, before it runs (docs/estimate.md). The
 * model is a decoder-only, pre-norm transformer without biases: per layer
 * the attention's query, key, value and output matrices (keys and values
 * have kv_heads heads), a feed-forward block of two matrices, or three when
 * gated (SwiGLU), and two RMSNorm weight vectors; a token embedding, a final
 * norm and an output head (shared with the embedding when tied), no learned
 * position table (RoPE). Every zero field of gma_transformer_t is its
 * default; hidden, layers, vocab, heads, seq_len and dtype_bytes have none.
 * ------------------------------------------------------------------------- */
typedef enum gma_estimate_mode {
  GMA_ESTIMATE_INFERENCE = 0, /* no autograd (torch.no_grad): weights, the KV cache and one
                                 layer's working tensors at a time, then the logits */
  GMA_ESTIMATE_FORWARD = 1,   /* a forward pass recording autograd, without backward: weights
                                 and every layer's tensors kept for backward, then the logits */
  GMA_ESTIMATE_TRAINING = 2   /* forward, backward (a cross-entropy loss in fp32) and an
                                 optimizer step */
} gma_estimate_mode_t;

/* How attention treats the batch x heads x seq x seq score matrix. */
typedef enum gma_attention {
  GMA_ATTENTION_EAGER = 0,    /* materialized (q k^T, then softmax): backward keeps one score-
                                 sized tensor per layer, the softmax's output (torch.softmax) */
  GMA_ATTENTION_EAGER_EXP = 1, /* materialized with a softmax written out (exp, then divide by
                                 the sum): backward keeps two, exp's output and the quotient */
  GMA_ATTENTION_FUSED = 2     /* FlashAttention or SDPA's fused kernels: no score matrix; backward
                                 keeps a per-row logsumexp in fp32 */
} gma_attention_t;

typedef enum gma_optimizer {
  GMA_OPTIMIZER_ADAM = 0,        /* Adam/AdamW as torch.optim keeps it: two moments per
                                    parameter in the parameters' dtype */
  GMA_OPTIMIZER_ADAM_MASTER = 1, /* mixed-precision Adam (Megatron, DeepSpeed): an fp32 master
                                    copy of the weights and two fp32 moments, 12 bytes a
                                    parameter */
  GMA_OPTIMIZER_SGD_MOMENTUM = 2, /* one momentum buffer in the parameters' dtype */
  GMA_OPTIMIZER_SGD = 3          /* no state */
} gma_optimizer_t;

typedef struct gma_transformer {
  size_t size;                /* sizeof(gma_transformer_t) as the caller compiled it */
  uint64_t hidden;            /* d_model (a multiple of heads) */
  uint64_t intermediate;      /* the feed-forward block's inner size (0: 4 x hidden) */
  uint64_t layers;
  uint64_t vocab;
  uint64_t heads;             /* query heads */
  uint64_t kv_heads;          /* key/value heads, dividing heads (0: heads; fewer: grouped-query
                                 attention) */
  uint64_t seq_len;           /* tokens per sequence in one forward pass */
  uint64_t batch;             /* sequences per forward pass (0: 1) */
  uint64_t dtype_bytes;       /* bytes of a parameter and of a gradient: 4 fp32, 2 bf16/fp16,
                                 1 fp8 (1, 2, 4 or 8) */
  uint64_t act_dtype_bytes;   /* bytes of an activation (0: dtype_bytes). Smaller than
                                 dtype_bytes is autocast: the matrices are also held cast to it
                                 for the forward (weight_copy_bytes) */
  uint64_t kv_cache_tokens;   /* inference: tokens per sequence the KV cache holds, seq_len
                                 new ones included (0: no cache, one forward over seq_len) */
  gma_estimate_mode_t mode;
  gma_attention_t attention;
  gma_optimizer_t optimizer;  /* training only */
  int plain_ffn;              /* 0: gated feed-forward block (SwiGLU, three matrices);
                                 nonzero: two matrices (GELU, ReLU) */
  int tied_embeddings;        /* nonzero: the output head is the token embedding */
  int grads_released;         /* training: nonzero: gradients are freed before each forward
                                 (optimizer.zero_grad() at the top of the loop); 0: they live
                                 through it (zero_grad after the forward, or set_to_none=False) */
  int step_foreach;           /* training: nonzero: the step's temporaries are one copy of the
                                 parameters (torch.optim's foreach implementation, its CUDA
                                 default); 0: two of the largest parameter (a per-tensor loop) */
} gma_transformer_t;

#if defined(__cplusplus) && __cplusplus < 202002L
#define GMA_TRANSFORMER_INIT {sizeof(gma_transformer_t)}
#else
#define GMA_TRANSFORMER_INIT {.size = sizeof(gma_transformer_t)}
#endif

/* When the estimate's peak happens. */
typedef enum gma_estimate_phase {
  GMA_PHASE_LAYER = 0,      /* inference: inside a layer (attention or feed-forward) */
  GMA_PHASE_HEAD = 1,       /* inference: the output head's logits */
  GMA_PHASE_FORWARD_END = 2, /* forward: the logits, every layer's tensors kept */
  GMA_PHASE_BACKWARD = 3,   /* training: the start of backward (the loss's gradient) */
  GMA_PHASE_STEP = 4        /* training: the optimizer step */
} gma_estimate_phase_t;

/* The estimate: the parts of the peak add up to total_bytes. */
typedef struct gma_estimate {
  size_t size;                /* sizeof(gma_estimate_t) as the caller compiled it */
  uint64_t total_bytes;       /* the peak of live bytes */
  uint64_t weights_bytes;     /* parameters x dtype_bytes */
  uint64_t weight_copy_bytes; /* the matrices cast to act_dtype_bytes (autocast), at the peak */
  uint64_t kv_cache_bytes;    /* inference */
  uint64_t activation_bytes;  /* layer tensors at the peak (kept for backward, or one layer's
                                 working set in inference) */
  uint64_t logits_bytes;      /* logits, the fp32 log-softmax and its gradient, at the peak */
  uint64_t gradient_bytes;    /* gradients live at the peak */
  uint64_t optimizer_bytes;   /* optimizer state */
  uint64_t step_temp_bytes;   /* the optimizer step's temporaries, at the peak */
  uint64_t params;            /* parameter count */
  uint64_t layer_activation_bytes; /* what one layer keeps for backward (forward, training) or
                                 its working set (inference) */
  gma_estimate_phase_t phase; /* when the peak happens */
} gma_estimate_t;

#if defined(__cplusplus) && __cplusplus < 202002L
#define GMA_ESTIMATE_INIT {sizeof(gma_estimate_t)}
#else
#define GMA_ESTIMATE_INIT {.size = sizeof(gma_estimate_t)}
#endif

/* Estimates the peak memory of model (its size field set, e.g. with
 * GMA_TRANSFORMER_INIT) into *out (its size field set with GMA_ESTIMATE_INIT).
 * No device is touched. GMA_ERR_INVALID_ARGUMENT, with gma_last_error() naming
 * the field and what would fix it, for a NULL pointer, a bad struct size, a
 * zero hidden, layers, vocab, heads, seq_len or dtype_bytes, heads not
 * dividing hidden, kv_heads not dividing heads, a dtype size other than 1, 2,
 * 4 or 8, an enum out of range, kv_cache_tokens outside inference, or a
 * result past 2^64 - 1 bytes. To pick a device with room for it:
 * gma_select_device(out->total_bytes, &device). Any thread; wait-free. */
GMA_API gma_status_t gma_estimate_transformer(const gma_transformer_t *model, gma_estimate_t *out);

/* ---------------------------------------------------------------------------
 * Allocator lifecycle
 * ------------------------------------------------------------------------- */
typedef struct gma gma_t;

/* Streams are the driver's handles: pass a CUstream or cudaStream_t as it is.
 * NULL and GMA_STREAM_LEGACY are the device's default stream;
 * GMA_STREAM_PER_THREAD is the calling thread's own default stream (a
 * different stream on each thread; the values are CUDA's). On the simulated
 * device, other streams come from gma_stream_create. */
typedef void *gma_stream_t;
#define GMA_STREAM_LEGACY ((gma_stream_t)0x1)
#define GMA_STREAM_PER_THREAD ((gma_stream_t)0x2)

/* Creates an allocator; config may be NULL for all defaults. One thread.
 * fork(): an allocator does not survive into a child process (its worker and
 * device threads stay in the parent, and CUDA is not fork-safe). In the
 * child, create a new allocator; every call on one inherited from the parent
 * fails at once with GMA_ERR_INVALID_ARGUMENT (the message names fork()),
 * its futures complete with GMA_ERR_CANCELLED (gma_future_release still
 * frees them), and gma_destroy on it releases the host memory the child
 * holds for it (see gma_destroy). The parent's allocators are unaffected. */
GMA_API gma_status_t gma_create(const gma_config_t *config, gma_t **out);
/* Waits for the device work gma knows of, returns every byte to the device and
 * frees the allocator. Live allocations are a leak: they are freed too, a
 * report goes to stderr and gma_last_error(), and GMA_ERR_LEAK is returned.
 * Requests still pending complete with GMA_ERR_CANCELLED (waiting threads
 * wake); memory that completed requests got but no wait collected is freed.
 * No other call on g may run concurrently or follow, except the future calls:
 * gma_future_poll/wait/release may run during and after gma_destroy. A later
 * call on g fails with GMA_ERR_INVALID_ARGUMENT where detectable (the last 64
 * destroyed allocators). NULL is a no-op.
 * In a child process after fork(), on an allocator the parent created:
 * returns GMA_OK at once and frees the child's copy of it (on the simulated
 * device, the host memory behind its device memory too) without waiting for
 * anything and without any CUDA call; live allocations are not reported.
 * What another parent thread was changing when fork() ran is leaked. */
GMA_API gma_status_t gma_destroy(gma_t *g);
/* For exit handlers: stops using g without waiting for the device. Stops
 * the worker thread and finishes a trace file (its status is returned:
 * GMA_OK, or the trace's write error); then every later call on g fails with
 * GMA_ERR_INVALID_ARGUMENT. Unlike gma_destroy it does not synchronize the
 * device (which never returns while, say, a collective waits for a peer
 * that exited), reports no leaks and frees nothing: device memory, even
 * what device work still uses, stays allocated until the process exits and
 * the driver takes it back. Calls racing with it are not allowed. NULL is a
 * no-op; on an allocator inherited across fork() it does what gma_destroy
 * does there. */
GMA_API gma_status_t gma_abandon(gma_t *g);
/* Which device backend g runs on: "sim" or "cuda". Any thread; wait-free. */
GMA_API const char *gma_device_name(const gma_t *g);

/* ---------------------------------------------------------------------------
 * Allocation
 * ------------------------------------------------------------------------- */
/* Allocates at least size bytes for use on stream; the pointer is aligned to at
 * least 256 bytes and safe to use on stream at once: no earlier device work on
 * any stream still touches it. Sizes are rounded up to 512 bytes. Blocks only
 * when the alternative is GMA_ERR_OOM: if the memory it needs is freed memory
 * that device work still uses, it waits on the host for that work (at most
 * oom_wait_ms), then retries. Any thread. */
GMA_API gma_status_t gma_alloc(gma_t *g, size_t size, gma_stream_t stream, void **out);
/* gma_alloc with a tag naming what the memory is for ("weights", "kv-cache";
 * 1..31 bytes of printable ASCII or UTF-8 text, at most 255 distinct tags per
 * allocator): snapshots, the memory summary and leak reports group memory by
 * tag. gma_alloc's memory has the tag "untagged". Any thread. */
GMA_API gma_status_t gma_alloc_tagged(gma_t *g, size_t size, gma_stream_t stream,
                                      const char *tag, void **out);
/* Frees ptr, ordered on the stream it was allocated on: work already queued on
 * that stream may still use it, and gma reuses the memory elsewhere only once
 * that work (and the work of every stream named in gma_record_stream) is done.
 * A foreign or interior pointer gives GMA_ERR_INVALID_POINTER (pinned host
 * memory from gma_host_alloc too: the message says to use gma_host_free), a
 * second free GMA_ERR_DOUBLE_FREE; neither changes anything. Any thread. */
GMA_API gma_status_t gma_free(gma_t *g, void *ptr);
/* Declares that work on stream (other than the allocation's own) uses the
 * allocation ptr points into, so its free waits for that work too
 * (CPU-fallback allocations included). ptr may be the allocation's start or
 * any address inside it (PyTorch records a tensor's whole storage; a view's
 * data pointer may lie inside); GMA_ERR_INVALID_POINTER if it lies in no live
 * allocation. Call it after queueing the work and before gma_free; if it
 * fails, synchronize stream before freeing ptr. Any thread. */
GMA_API gma_status_t gma_record_stream(gma_t *g, void *ptr, gma_stream_t stream);
/* Returns to the device every segment with no live allocation whose device work
 * is known to be done. Never waits for the device. Any thread. */
GMA_API gma_status_t gma_empty_cache(gma_t *g);
/* Gives cached memory back to the device until at most keep_bytes of it
 * (reserved - allocated) stay: whole free segments only, never memory whose
 * device work may still be pending, and the device calls are made outside the
 * allocator's lock. Under plan:on an active plan with no planned block live
 * is cache too: its arena goes back (and the plan stops) when the rest is
 * not enough. gma_empty_cache is gma_trim(g, 0). Never waits for the
 * device's work. Any thread. */
GMA_API gma_status_t gma_trim(gma_t *g, uint64_t keep_bytes);
/* Allocates n blocks on stream at once, all or nothing: on failure nothing
 * stays allocated and ptrs is untouched. The blocks are placed one after
 * another in one segment where they fit (one device allocation on a miss);
 * only when no such room can be had are they placed one by one. Every pointer
 * is 256-byte aligned and each block may be freed on its own. Any thread. */
GMA_API gma_status_t gma_alloc_batch(gma_t *g, size_t n, const size_t *sizes,
                                     gma_stream_t stream, void **ptrs);
/* Warm-up: fills stream's bins with counts[i] blocks of sizes[i] (i < n), so
 * the first allocations of a known workload are bin hits. All or nothing.
 * Blocks beyond bin_depth, or above bin_max, stay cached for the stream in
 * the pool. Any thread. */
GMA_API gma_status_t gma_reserve(gma_t *g, gma_stream_t stream, size_t n, const size_t *sizes,
                                 const size_t *counts);
/* ---------------------------------------------------------------------------
 * Async allocation. A future is the answer to one request; the worker thread
 * serves requests that cannot be served at once on the calling thread.
 * ------------------------------------------------------------------------- */
typedef struct gma_future gma_future_t;

/* Called once when a future completes, on one of two threads: the worker
 * thread, or the submitting thread inside the gma_alloc_async (or
 * gma_alloc_batch_async) call when the request is complete at once. Never on
 * another thread: a thread waiting on a future that has a callback leaves
 * serving it to the worker (it serves one without a callback itself, see
 * gma_future_wait). gma_future_wait returns only after it ran. It may call
 * gma_future_status; it must not wait on or release the future, and should
 * not block for long (it runs on the worker).
 * It may submit requests to the same allocator, as a chain does (the next
 * request from each completion): a submit on the worker thread never waits
 * for ring room, which only the worker makes, and is never refused for it
 * (nonblocking changes nothing there). The request joins a list of the
 * worker's own, served after the ring's at its next pass, so a chain works
 * with any ring_size and is never dropped. While gma_destroy cancels what
 * is left, such a submit fails with GMA_ERR_CANCELLED (a callback that
 * submits again on every outcome cannot keep the teardown going). A submit
 * to another allocator waits for that one's ring like any thread's. */
typedef void (*gma_future_callback_t)(gma_future_t *f, gma_status_t status, void *user);

typedef struct gma_async_options {
  size_t size;                    /* sizeof(gma_async_options_t) as the caller compiled it */
  uint64_t timeout_ns;            /* how long to wait for memory; 0 = future_timeout_ms,
                                     UINT64_MAX = no limit */
  int nonblocking;                /* ring full: fail with GMA_ERR_BUSY instead of waiting
                                     (on the worker thread a submit never waits: see
                                     gma_future_callback_t) */
  gma_future_callback_t callback; /* optional */
  void *user;                     /* passed to the callback */
  int worker_only;                /* never serve on the calling thread: always hand the
                                     request to the worker (see gma_alloc_async) */
} gma_async_options_t;

#if defined(__cplusplus) && __cplusplus < 202002L
#define GMA_ASYNC_OPTIONS_INIT {sizeof(gma_async_options_t)}
#else
#define GMA_ASYNC_OPTIONS_INIT {.size = sizeof(gma_async_options_t)}
#endif

/* Returns a future at once (options may be NULL). The future is already
 * complete, with no worker hop, when the stream's bin can serve the request,
 * or when the pool can serve it from memory it already holds without waiting:
 * the pool's lock is free (it is tried, never waited for), no device
 * allocation is needed, and no earlier request is waiting for memory (those
 * are served first, in order). The memory follows the same reuse rules as
 * gma_alloc's; the callback then runs on the calling thread.
 * options->worker_only sends every request to the worker instead.
 * Otherwise the request goes to the worker through a bounded ring; when the
 * ring is full the call waits for room, or fails with GMA_ERR_BUSY when
 * options->nonblocking is set; a call from a callback on the worker thread
 * never waits (see gma_future_callback_t). When memory is short the worker waits for
 * frees (back-pressure) until the deadline, then completes the future with
 * GMA_ERR_TIMEOUT: a request is never lost. GMA_STREAM_PER_THREAD is refused
 * (the worker cannot name another thread's default stream). Any thread. */
GMA_API gma_status_t gma_alloc_async(gma_t *g, size_t size, gma_stream_t stream,
                                     const gma_async_options_t *options, gma_future_t **out);
/* The same for a batch (see gma_alloc_batch). ptrs (n entries) is filled
 * by the gma_future_wait or gma_future_take that collects the memory (not
 * at completion, nor by poll); keep it alive until then. */
GMA_API gma_status_t gma_alloc_batch_async(gma_t *g, size_t n, const size_t *sizes,
                                           gma_stream_t stream, void **ptrs,
                                           const gma_async_options_t *options,
                                           gma_future_t **out);
/* GMA_PENDING, GMA_OK, or the request's error. Never blocks. Complete means
 * the completion finished, callback included (inside its own callback the
 * future counts as complete): after GMA_OK here a gma_future_wait with
 * timeout 0 collects. GMA_ERR_INVALID_ARGUMENT for a future already given
 * back (see gma_future_release). GMA_ERR_CANCELLED
 * once the allocator was destroyed, also for a request that had been served:
 * its memory went with the allocator; and, in a child process after fork(),
 * for every future of an allocator the parent created (so wait never hangs
 * there). */
GMA_API gma_status_t gma_future_poll(gma_future_t *f);
/* The same as gma_future_poll (a second name for readability). */
GMA_API gma_status_t gma_future_status(gma_future_t *f);
/* Waits up to timeout_ns (UINT64_MAX: no limit) for completion. GMA_OK:
 * *ptr is the allocation (a batch's first block, and the batch's ptrs are
 * filled), which now belongs to the caller; on any other status *ptr is set
 * to NULL. Exactly one wait collects the memory: every later wait on the
 * same future, on this thread or another, returns GMA_ERR_ALREADY_COLLECTED.
 * A wait on a single-block future with ptr NULL collects nothing: it only
 * waits, and returns GMA_OK once the memory is ready. A wait of 1 ms or
 * more on a request the worker has not begun serves it on the calling
 * thread (the thread would block anyway), except a worker_only request or
 * one with a callback, which the worker serves.
 * GMA_PENDING when this wait ran out (the request goes on). Otherwise the
 * request's error. May run while another thread destroys the allocator: it
 * then returns GMA_ERR_CANCELLED (a request not served yet, or memory not
 * collected before the teardown began), or GMA_OK for memory it collected
 * first, which gma_destroy then frees as a live allocation (and reports as a
 * leak). In a child process after fork(), on a future of an allocator the
 * parent created: GMA_ERR_CANCELLED at once (see gma_create). */
GMA_API gma_status_t gma_future_wait(gma_future_t *f, uint64_t timeout_ns, void **ptr);
/* Gives the future back (once). A request still pending is cancelled, and
 * memory it got that no gma_future_wait collected is freed. Allowed during
 * and after gma_destroy (the future is then only freed). NULL: GMA_OK,
 * nothing to do. A second release, or a poll, wait or take after it, returns
 * GMA_ERR_INVALID_ARGUMENT as a best effort, while the object is still
 * gma's (a future complete when released, named again by the same thread
 * before its next request: docs/async.md); a released
 * handle must not be used again. */
GMA_API gma_status_t gma_future_release(gma_future_t *f);
/* Waits, collects and releases in one call: gma_future_wait(f, timeout_ns,
 * ptr) and then, unless it returned GMA_PENDING, gma_future_release(f).
 *  - GMA_OK: *ptr is the allocation (a batch's first block; the batch's ptrs
 *    are filled) and belongs to the caller; f is released.
 *  - GMA_PENDING: timeout_ns ran out first (0 never waits). f is NOT
 *    released and the request goes on: call gma_future_take again, or
 *    gma_future_wait, or gma_future_release to cancel it.
 *  - any other status (the request's error, GMA_ERR_CANCELLED,
 *    GMA_ERR_ALREADY_COLLECTED when another wait collected the memory): *ptr
 *    is NULL and f is released.
 *  - GMA_ERR_INVALID_ARGUMENT when f is NULL, or ptr is NULL on a
 *    single-block future (only a batch's future, whose pointers go to its
 *    ptrs, may pass NULL): nothing waited for and f is NOT released.
 * So after any status but GMA_PENDING and GMA_ERR_INVALID_ARGUMENT the
 * future is gone: do not release it again. On a future that is already
 * complete it reads no clock and makes no system call. Any thread that owns
 * f (the same rules as gma_future_release). */
GMA_API gma_status_t gma_future_take(gma_future_t *f, uint64_t timeout_ns, void **ptr);

/* Memory pressure: reserved memory against memory_limit, or the device's
 * used memory against its total, whichever is higher; reported to the
 * callback. With an explicit release_threshold, timed trimming keeps it at
 * low and medium pressure, a quarter of it at high pressure, and nothing at
 * critical pressure. With the default ("auto") only the device's free memory
 * counts (pressure from outside gma), and it never takes the working set:
 * docs/near-the-limit.md, "Trimming". */
typedef enum gma_pressure {
  GMA_PRESSURE_LOW = 0,     /* below 60% */
  GMA_PRESSURE_MEDIUM = 1,  /* 60% to 80% */
  GMA_PRESSURE_HIGH = 2,    /* above 80% */
  GMA_PRESSURE_CRITICAL = 3 /* above 95% */
} gma_pressure_t;
typedef void (*gma_pressure_callback_t)(gma_t *g, gma_pressure_t level, void *user);
/* cb is called on the worker thread whenever the level it sees changes
 * (and once, with the current level, after each call of this function);
 * NULL removes it. When this returns, the previous callback is not running
 * and will not be called again, so its user data may be freed: a call made
 * while the worker is inside the callback waits for it to return, except a
 * call from inside the callback itself. So do not call it while holding a
 * lock the callback takes, nor from another allocator's callback that this
 * one's callback could be waiting on: each would wait for the other. The
 * callback may call gma functions (not gma_destroy); its async submits never
 * wait for ring room (see gma_future_callback_t). Any thread. */
GMA_API gma_status_t gma_set_pressure_callback(gma_t *g, gma_pressure_callback_t cb, void *user);

/* ---------------------------------------------------------------------------
 * OOM observer: a hook at the moment an allocation is about to fail, where a
 * program can free memory of its own (caches, buffers it can rebuild) and
 * ask gma to try once more, as PyTorch's OOM observers and RMM's failure
 * callback do. */
typedef struct gma_oom_info {
  size_t size;          /* sizeof(gma_oom_info_t) */
  size_t requested;     /* bytes the call asked for (a batch: their sum) */
  gma_stream_t stream;  /* the call's stream */
  uint64_t allocated;   /* gma_stats' allocated.current then */
  uint64_t reserved;    /* reserved.current then */
  uint64_t device_free; /* the device's free memory then (0 if it cannot say) */
  uint64_t device_total;
  const char *message;  /* the OOM message the call would return; valid during the call */
} gma_oom_info_t;
#define GMA_OOM_FAIL 0  /* report the OOM */
#define GMA_OOM_RETRY 1 /* memory was freed: try once more */
typedef int (*gma_oom_observer_t)(gma_t *g, const gma_oom_info_t *info, void *user);
/* cb is called before gma_alloc or gma_alloc_batch reports GMA_ERR_OOM (after
 * gma's own release, wait and CPU fallback), on the calling thread, with no
 * gma lock held. It returns GMA_OOM_RETRY to make the call try once more
 * (the result of that try is the call's), or GMA_OOM_FAIL. A call that
 * succeeds on the retry counts no OOM (num_ooms) and leaves gma_last_error()
 * as it was. Allocations the observer itself makes do not call it again:
 * they fail at once when memory is short. Async requests and captures do not
 * call it. NULL removes it. When this returns, the previous observer is not
 * running and will not be called again, except when this is called from
 * inside an observer (which does not wait). Any thread. */
GMA_API gma_status_t gma_set_oom_observer(gma_t *g, gma_oom_observer_t cb, void *user);

/* Call before destroying a stream that gma has seen (unless you destroy it
 * with gma_stream_destroy, which does this). gma closes the stream's epoch
 * with one event and forgets the handle: the stream's cached blocks go to the
 * shared pool once its work is done, and a new stream that gets the same
 * handle value starts clean. Never blocks, except after a device error: if
 * the closing event cannot be recorded, it waits for the stream instead (or
 * keeps the stream's cached memory reserved until gma_destroy if that wait
 * fails too, and says so). Live device allocations made on
 * the stream, and pinned host blocks used on it, stay valid and may be freed
 * later; their reuse waits for the work queued before the retire, so queue
 * no more work on the stream that uses them (that is what retiring means). A stream gma has no record of
 * (never used with gma, or already retired) is GMA_OK and nothing happens;
 * gma makes no device call with such a handle. A later call that names a
 * retired handle (gma_alloc, gma_record_stream) makes gma know it again, as
 * a new stream: so retire a stream only when no call will name it. A thread's per-thread
 * default stream is retired by gma when the thread exits. Any thread. */
GMA_API gma_status_t gma_stream_retire(gma_t *g, gma_stream_t stream);

/* ---------------------------------------------------------------------------
 * Statistics. Byte counts: reserved = allocated + stream_cached + pending + free.
 * ------------------------------------------------------------------------- */
typedef struct gma_stat {
  uint64_t current; /* now */
  uint64_t peak;    /* highest current since gma_create */
  uint64_t total;   /* bytes ever added (cumulative) */
} gma_stat_t;

typedef struct gma_stats {
  size_t size;          /* sizeof(gma_stats_t) as the caller compiled it */
  gma_stat_t allocated; /* bytes in live allocations (rounded block sizes) */
  gma_stat_t requested; /* bytes callers asked for in live allocations */
  gma_stat_t reserved;  /* bytes held from the device in segments */
  gma_stat_t active;    /* allocated + pending: memory the device may still use */
  gma_stat_t cached;    /* reserved - allocated: memory gma holds for reuse (peaks of
                           allocated, requested, active, cached: sampled, docs/stats.md) */
  uint64_t stream_cached_bytes; /* freed, reusable at once on its own stream only */
  uint64_t pending_bytes;       /* freed, waiting for other streams' work (record_stream) */
  uint64_t free_bytes;          /* reusable on any stream */
  uint64_t num_allocs;          /* blocks handed out: one per successful gma_alloc or async
                                   request, n per batch of n (CPU fallbacks included) */
  uint64_t num_frees;           /* successful gma_free calls */
  uint64_t num_device_allocs;   /* segments taken from the device (growable: chunks mapped) */
  uint64_t num_device_frees;    /* segments given back to the device (growable: chunks unmapped) */
  uint64_t num_ooms;            /* calls that failed with GMA_ERR_OOM (an async request
                                   counts once, when it gives up) */
  uint64_t num_oom_retries;     /* device OOMs answered by releasing cache and retrying */
  uint64_t hits_bin;            /* served by the stream's lock-free bin (no lock taken) */
  uint64_t hits_stream;         /* served by the stream's own cache in the pool */
  uint64_t hits_pool;           /* served by the shared free pool */
  uint64_t hits_device;         /* needed a new segment from the device */
  uint64_t num_segments;        /* segments held now */
  uint64_t largest_free_block;  /* largest block in stream caches or the free pool */
  double fragmentation;         /* share of the idle bytes (free, stream-cached, binned) in free
                                   regions smaller than the median live block size (rounded
                                   down to a power of two): cache too small for a typical
                                   request. 0 with nothing idle or nothing live (docs/stats.md) */
  uint64_t num_streams;         /* streams gma keeps a record of (retired ones excluded) */
  uint64_t num_cross_stream_waits; /* reuse:auto/wait: device-side waits made instead of growing */
  uint64_t num_epoch_events;    /* events recorded to close stream epochs */
  uint64_t num_batches;         /* gma_alloc_batch calls that succeeded */
  uint64_t num_batches_split;   /* of those, placed block by block (no contiguous room) */
  uint64_t bytes_trimmed;       /* bytes given back to the device by every trim, not only
                                   gma_trim / gma_empty_cache: the worker's timed trims
                                   (idle, above release_threshold, pressure) count too, and
                                   what the OOM retry gives back (segments, chunks) */
  uint64_t trims_explicit;      /* gma_trim / gma_empty_cache calls that released memory */
  uint64_t trims_timed;         /* timed trims that released cache above release_threshold,
                                   or (auto) memory outside the working set under pressure */
  uint64_t trims_idle;          /* timed trims that released segments idle > idle_ms */
  uint64_t trims_pressure;      /* timed trims made more aggressive by memory pressure */
  uint64_t grows_worker;        /* segments the worker took ahead of demand (grow_ahead) */
  uint64_t grows_inline;        /* segments a caller's allocation had to take itself */
  uint64_t worker_wakeups;      /* times the worker thread woke up */
  int pressure_level;           /* gma_pressure_t at the worker's last look */
  uint64_t futures_submitted;   /* async requests accepted (single and batch) */
  uint64_t futures_ready_at_once; /* of those, served at once on the submitting thread
                                     (a bin, or the pool's held memory; no worker hop) */
  uint64_t futures_ready;       /* completed with memory (at once or by the worker) */
  uint64_t futures_failed;      /* completed with an error other than a timeout */
  uint64_t futures_timed_out;   /* completed with GMA_ERR_TIMEOUT */
  uint64_t queue_depth;         /* async requests in the ring or waiting for memory now */
  uint64_t submit_to_ready_p50_ns; /* worker-served requests, submit to completion */
  uint64_t submit_to_ready_p99_ns; /* (within 1/8 of the value) */
  gma_stat_t host_allocated;    /* pinned host memory in live gma_host_alloc blocks */
  gma_stat_t host_reserved;     /* pinned host memory held (live, cached and pending) */
  uint64_t num_host_allocs;     /* successful gma_host_alloc calls */
  uint64_t num_host_frees;      /* successful gma_host_free calls */
  uint64_t num_fallbacks;       /* gma_alloc calls served from host memory (fallback:host) */
  uint64_t fallback_bytes;      /* host memory in live fallback allocations now */
  uint64_t num_oom_waits;       /* times an allocation waited for device work before an OOM
                                   (oom_wait_ms) */
  /* Planned memory (plan:on; all 0 otherwise). The arena is one allocation
   * of the pool: reserved counts all of it, used or not; allocated counts the
   * planned allocations in it. With nothing live, reserved = allocated +
   * stream_cached + pending + free + plan_arena_bytes. */
  int plan_state;               /* 0 off, 1 learning, 2 verifying, 3 placing, 4 active */
  uint64_t plan_hits;           /* gma_alloc calls served at their planned address */
  uint64_t plan_misses;         /* calls of an active plan's streams served otherwise
                                   (another size, order or stream, an extra call, or the
                                   planned memory not yet reusable) */
  uint64_t plan_replans;        /* plans dropped because iterations stopped matching */
  uint64_t plan_arena_bytes;    /* the arenas held: the active plan's, and a dropped plan's
                                   until its blocks are freed and a mark gives it back */
  uint64_t plan_lower_bound;    /* peak live bytes of the planned allocations: no placement
                                   needs less than this */
  uint64_t plan_slots;          /* allocations the plan places per iteration */
  uint64_t plan_iterations;     /* gma_iteration_mark calls */
  /* CUDA graphs (gma_graph_pool_create). Graph pools hold chunks of the
   * pool: reserved counts them whole; allocated counts the allocations in
   * them; the rest of them is graph_pool_cached_bytes, so that
   * reserved = allocated + stream_cached + pending + free
   *            + graph_pool_cached_bytes (+ the plan's arena, see above). */
  uint64_t graph_pools;         /* graph pools made and not released */
  uint64_t graph_pool_bytes;    /* memory graph pools hold (used or not) */
  uint64_t graph_pool_cached_bytes; /* the part of it no live allocation uses */
  uint64_t graph_captures;      /* captures gma was told of and not ended */
  /* Growable segments (expandable_segments:true; 0 with ordinary ones):
   * reserved counts the memory mapped into their address ranges; these
   * count the ranges (virtual address space, no memory). */
  uint64_t address_ranges;         /* address ranges reserved */
  uint64_t address_reserved_bytes; /* their virtual bytes */
  /* The handle pool (growable segments): when an allocation finds no room,
   * gma unmaps free chunks from between live blocks and keeps their
   * physical memory, which the next growth maps at the address it needs.
   * Kept memory is the device's but in no segment: not in reserved; gma's
   * physical memory is reserved + kept_bytes. A trim, pressure or
   * gma_empty_cache frees it. */
  uint64_t kept_bytes;        /* physical memory kept, mapped nowhere */
  uint64_t kept_chunks;       /* its chunks */
  uint64_t num_device_remaps; /* of num_device_allocs: kept chunks mapped again (no new memory) */
  uint64_t num_device_keeps;  /* of num_device_frees: unmaps that kept the physical memory */
  uint64_t num_kept_frees;    /* kept chunks given back to the device (bytes_trimmed counts them) */
} gma_stats_t;

#if defined(__cplusplus) && __cplusplus < 202002L
#define GMA_STATS_INIT {sizeof(gma_stats_t)}
#else
#define GMA_STATS_INIT {.size = sizeof(gma_stats_t)}
#endif

/* Fills *out (whose size field the caller set, e.g. with GMA_STATS_INIT).
 * Counters kept per stream on the lock-free path are summed on read, so while
 * other threads allocate the sums may be a few operations apart; when no call
 * is in flight the snapshot is exact and the equation above holds. Peaks of
 * allocated/requested/active are sampled at every pool operation and read.
 * Any thread. */
GMA_API gma_status_t gma_stats(gma_t *g, gma_stats_t *out);

/* Marks the end of one iteration of a repeating workload and the start of
 * the next (plan:on; a no-op returning GMA_OK otherwise). Call it at the same
 * point of every iteration, for example after the optimizer step, from one
 * thread. See docs/planned-memory.md for what is learned and when a
 * plan is made, used and dropped. The mark that puts a new plan to use waits
 * once for the device to finish its queued work (as cudaDeviceSynchronize)
 * and gives back the cache of the learning iterations before it takes the
 * arena; every other mark returns without waiting. Any thread. */
GMA_API gma_status_t gma_iteration_mark(gma_t *g);

/* ---------------------------------------------------------------------------
 * CUDA graphs (stream capture)
 *
 * A captured graph replays its work at the addresses it had at capture, at
 * every launch. Memory allocated while a stream captures therefore comes
 * from a graph pool, which hands it to no one else until the pool is
 * released (PyTorch's private pools). The pattern:
 *
 *   gma_graph_pool_t *pool;  gma_graph_pool_create(g, &pool);
 *   gma_capture_begin(g, s, pool);      // before cuStreamBeginCapture(s, ...)
 *   cuStreamBeginCapture(s, mode);
 *   ... gma_alloc(g, n, s, &p) ... kernels on s ... gma_free(g, p) ...
 *   cuStreamEndCapture(s, &graph);
 *   gma_capture_end(g, s);
 *   ... cuGraphLaunch(exec, s), many times ...
 *   (graphs destroyed) gma_graph_pool_release(g, pool);
 *
 * While a capture gma was told of is underway, every allocation asks the
 * device whether its stream captures (a stream that joined the capture
 * through an event is served from the same pool); otherwise the hot path is
 * unchanged. A request on a stream capturing without gma_capture_begin fails
 * with GMA_ERR_INVALID_ARGUMENT when it reaches the pool (a bin hit cannot
 * tell). gma makes no capture-unsafe call: its driver calls that CUDA counts
 * as unsafe during capture run in relaxed capture mode, and it records no
 * event on a capturing stream. See docs/graphs.md for the rules
 * a program keeps (launch graphs sharing a pool in capture order).
 * ------------------------------------------------------------------------- */
typedef struct gma_graph_pool gma_graph_pool_t;

/* Makes an empty graph pool of g (it takes memory at the first capture's
 * first allocation). Any thread. */
GMA_API gma_status_t gma_graph_pool_create(gma_t *g, gma_graph_pool_t **out);
/* The program launches no graph captured into pool any more (they are
 * destroyed or never launched again). Waits once for the device's queued
 * work (as cuCtxSynchronize: graphs launched before may still run), then
 * gives the pool's unused memory back to g; memory still allocated goes
 * back as it is freed. pool is invalid afterwards. GMA_ERR_INVALID_ARGUMENT
 * while a capture into it is underway, or for a pool that is not g's. */
GMA_API gma_status_t gma_graph_pool_release(gma_t *g, gma_graph_pool_t *pool);
/* Tells gma that stream is about to capture (call it before
 * cuStreamBeginCapture: then gma records nothing on the stream in between;
 * calling it right after also works) and that allocations in that capture,
 * on stream and on every stream that joins it, come from pool. One capture
 * per stream at a time; captures into one pool may share it one after the
 * other. GMA_ERR_UNSUPPORTED on a device without capture (the simulated
 * device). Any thread. */
GMA_API gma_status_t gma_capture_begin(gma_t *g, gma_stream_t stream, gma_graph_pool_t *pool);
/* The capture gma_capture_begin announced on stream has ended (call it
 * after cuStreamEndCapture). What the capture freed becomes reusable by the
 * pool's later captures. */
GMA_API gma_status_t gma_capture_end(gma_t *g, gma_stream_t stream);

typedef struct gma_graph_pool_stats {
  size_t size;                  /* sizeof(gma_graph_pool_stats_t) as the caller compiled it */
  uint64_t id;                  /* 1, 2, ... in order of creation in g */
  uint64_t reserved_bytes;      /* memory the pool holds */
  uint64_t peak_reserved_bytes;
  uint64_t allocated_bytes;     /* in live allocations (and blocks freed during a capture
                                   still underway, which only that capture may reuse) */
  uint64_t chunks;              /* pieces of g's memory it holds */
  uint64_t captures;            /* captures into it underway */
  uint64_t allocs, frees;       /* allocations served from it, and their frees */
} gma_graph_pool_stats_t;

#if defined(__cplusplus) && __cplusplus < 202002L
#define GMA_GRAPH_POOL_STATS_INIT {sizeof(gma_graph_pool_stats_t)}
#else
#define GMA_GRAPH_POOL_STATS_INIT {.size = sizeof(gma_graph_pool_stats_t)}
#endif

/* Fills *out (its size field set by the caller). Any thread. */
GMA_API gma_status_t gma_graph_pool_stats(gma_t *g, gma_graph_pool_t *pool,
                                          gma_graph_pool_stats_t *out);

/* What gma knows of one stream. */
typedef struct gma_stream_stats {
  size_t size;            /* sizeof(gma_stream_stats_t) as the caller compiled it */
  uint64_t allocs;        /* successful gma_alloc calls on the stream */
  uint64_t frees;         /* frees of blocks allocated on the stream */
  uint64_t hits;          /* allocations served by the stream's lock-free bins */
  uint64_t misses;        /* allocations that went to the pool */
  uint64_t allocated_bytes; /* live bytes allocated on the stream */
  uint64_t cached_bytes;  /* freed bytes cached for the stream (bins and pool) */
  uint64_t epoch;         /* the stream's open epoch */
  uint64_t safe_epoch;    /* every epoch up to this one has completed */
} gma_stream_stats_t;

#if defined(__cplusplus) && __cplusplus < 202002L
#define GMA_STREAM_STATS_INIT {sizeof(gma_stream_stats_t)}
#else
#define GMA_STREAM_STATS_INIT {.size = sizeof(gma_stream_stats_t)}
#endif

/* Statistics of one stream; GMA_ERR_INVALID_ARGUMENT if gma has no record of
 * it (never used, or retired). Any thread. */
GMA_API gma_status_t gma_stream_stats(gma_t *g, gma_stream_t stream, gma_stream_stats_t *out);

/* ---------------------------------------------------------------------------
 * Where memory lives; pinned host memory
 * ------------------------------------------------------------------------- */
typedef enum gma_memory_kind {
  GMA_MEMORY_DEVICE = 0,      /* device memory (gma_alloc) */
  GMA_MEMORY_HOST_PINNED = 1, /* pinned host memory (gma_host_alloc) */
  GMA_MEMORY_FALLBACK = 2     /* pinned host memory mapped for the device, given by
                                 gma_alloc when device memory ran out (fallback:host) */
} gma_memory_kind_t;

typedef struct gma_pointer_info {
  size_t size;              /* sizeof(gma_pointer_info_t) as the caller compiled it */
  gma_memory_kind_t kind;
  void *base;               /* the allocation ptr lies in (ptr may point inside it) */
  size_t requested;         /* bytes asked for */
  size_t block_size;        /* bytes gma set aside for it */
  gma_stream_t stream;      /* the stream it was allocated on */
  const char *tag;          /* its tag (valid while g lives) */
} gma_pointer_info_t;
#if defined(__cplusplus) && __cplusplus < 202002L
#define GMA_POINTER_INFO_INIT {sizeof(gma_pointer_info_t)}
#else
#define GMA_POINTER_INFO_INIT {.size = sizeof(gma_pointer_info_t)}
#endif

/* Describes the live allocation ptr points into (its start or inside the
 * bytes asked for). GMA_ERR_INVALID_POINTER if ptr lies in no live
 * allocation of g, or in a block's rounding past the bytes asked for. Any
 * thread. */
GMA_API gma_status_t gma_pointer_info(gma_t *g, const void *ptr, gma_pointer_info_t *info);

/* Pinned (page-locked) host memory for copies between host and device, from
 * a cache with size classes: gma_host_free is stream-ordered like gma_free,
 * and a freed block is handed out again only once the work queued on its
 * stream before the free (a copy from or to it) has completed, so neither the
 * host nor another copy overwrites data a copy is still reading. The worker
 * gives cached host memory above host_release_threshold back. On CUDA the
 * memory comes from cuMemHostAlloc (portable, device-mapped); on the
 * simulated device it is ordinary host memory. Any thread. */
GMA_API gma_status_t gma_host_alloc(gma_t *g, size_t size, gma_stream_t stream, void **out);
/* GMA_ERR_INVALID_POINTER for memory gma_host_alloc did not return; for device
 * or CPU-fallback memory of g the message says to use gma_free. */
GMA_API gma_status_t gma_host_free(gma_t *g, void *ptr);

/* ---------------------------------------------------------------------------
 * Live allocations: ages and leak reports
 * ------------------------------------------------------------------------- */
typedef struct gma_allocation_info {
  void *ptr;
  size_t requested;   /* bytes asked for */
  size_t block_size;  /* bytes set aside */
  gma_stream_t stream;
  const char *tag;    /* valid while g lives */
  uint64_t age_ns;    /* time since it was handed out, to the worker's tick
                         (trim_interval_ms) or better */
} gma_allocation_info_t;

/* The live device allocations at least min_age_ns old, oldest first: fills
 * out[0 .. min(cap, *count) - 1] and sets *count to how many there are (which
 * may exceed cap; cap 0 just counts). Any thread. */
GMA_API gma_status_t gma_find_old_allocations(gma_t *g, uint64_t min_age_ns,
                                              gma_allocation_info_t *out, size_t cap,
                                              size_t *count);
/* A human report of the live device allocations: count and bytes by tag, then
 * the oldest (up to rows of them) with size, stream, tag and age. gma_destroy
 * prints it to stderr when allocations are left. GMA_ERR_INVALID_SIZE if len
 * is too small (the message says how much is needed). Any thread. */
GMA_API gma_status_t gma_live_report(gma_t *g, size_t rows, char *buf, size_t len);

/* ---------------------------------------------------------------------------
 * Trace recording, snapshots and the memory summary
 * ------------------------------------------------------------------------- */
/* Starts recording every allocation event of g (allocations, frees,
 * record_stream, async submits and completions, batches, segment growth and
 * release, trims, OOMs) to path as gma's trace CSV (docs/trace-format.md),
 * replacing a trace already running. GMA_ERR_CONFIG if the file
 * cannot be created. Any thread. */
GMA_API gma_status_t gma_trace_start(gma_t *g, const char *path);
/* Writes what is buffered and closes the trace; GMA_OK when none runs. */
GMA_API gma_status_t gma_trace_stop(gma_t *g);
/* Writes g's segments (and a growable one's address range id) and blocks
 * (address, size, state, stream, requested size, tag), and the handle
 * pool's kept bytes, as JSON to path, taken under the pool lock (a
 * consistent picture). GMA_ERR_INVALID_ARGUMENT if the file cannot be created or
 * written. Any thread. */
GMA_API gma_status_t gma_snapshot_json(gma_t *g, const char *path);

/* The formats gma_snapshot_write writes. */
typedef enum gma_snapshot_format {
  GMA_SNAPSHOT_JSON = 0,  /* gma's own JSON: exactly what gma_snapshot_json writes */
  GMA_SNAPSHOT_TORCH = 1, /* a pickle with the structure of PyTorch's
                             torch.cuda.memory._snapshot(), which
                             torch.cuda.memory._dump_snapshot writes and
                             pytorch.org/memory_viz and torch.cuda._memory_viz
                             read (docs/debugging.md) */
} gma_snapshot_format_t;

/* Writes a snapshot of g to path in format.
 *
 * GMA_SNAPSHOT_TORCH writes a dict (pickle protocol 2; only dicts, lists,
 * tuples, strings, ints and bools, so a restricted unpickler loads it) with:
 *   "segments": one dict per segment, taken under the pool lock: device,
 *     address, total_size, allocated_size (live blocks), active_size (live and
 *     pending-free blocks), requested_size, stream (of its first block in use;
 *     0 when none), segment_type ("small" / "large"), segment_pool_id (0, 0),
 *     is_expandable (a growable segment), frames [] and "blocks": dicts of
 *     address, size, requested_size, state ("active_allocated" live,
 *     "active_pending_free" freed and waiting for its stream, "inactive"
 *     cached or free) and frames []. A planned-memory arena (plan:on) is one
 *     active_allocated block whose requested_size is its planned blocks'.
 *   "device_traces": a list indexed by device ordinal, empty for other
 *     devices; for g's device, when a trace is running (gma_trace_start or
 *     trace:PATH), every event it recorded so far, in PyTorch's entry form
 *     (action, addr, size, stream, time_us since the trace began, frames []):
 *     allocate -> "alloc"; free -> "free_requested" then "free_completed";
 *     segment_alloc / segment_free / segment_map / segment_unmap by name;
 *     oom -> "oom" (size: the request; device_free 0). Rows PyTorch has no
 *     action for (record_stream, async_submit, batch, trim...) are left
 *     out; a served single async allocation is an "alloc". Without a
 *     running trace the list for g's device is empty.
 * No stack frames are recorded: every "frames" list is empty.
 *
 * GMA_ERR_INVALID_ARGUMENT for a NULL or empty path, an unknown format, or a
 * file that cannot be created or written (the message names the file and the
 * reason; a partly written file is removed); GMA_ERR_OOM when host memory
 * runs out. Any thread; the trace keeps recording. */
GMA_API gma_status_t gma_snapshot_write(gma_t *g, const char *path, gma_snapshot_format_t format);
/* Writes a human-readable table of g's memory (current, peak and total by
 * pool, segments, OOMs and retries, hits by level, futures, trims) into buf,
 * NUL-terminated. GMA_ERR_INVALID_SIZE if len is too small (the message says
 * how much is needed; buf then holds as much as fits). Any thread. */
GMA_API gma_status_t gma_memory_summary(gma_t *g, char *buf, size_t len);

/* ---------------------------------------------------------------------------
 * Streams and simulated kernels. Streams work on every device; gma_sim_launch
 * only on the simulated device, where it lets programs and tests run "kernels"
 * (host functions) in stream order against block memory.
 * ------------------------------------------------------------------------- */
GMA_API gma_status_t gma_stream_create(gma_t *g, gma_stream_t *out);
/* Retires the stream in gma (see gma_stream_retire), then destroys it. Like
 * cuStreamDestroy it returns at once; queued work still runs to completion.
 * The handle value may be given to a stream created later. If the retire
 * reports a device error, the stream is still destroyed (do not destroy it
 * again); its memory is safe either way. */
GMA_API gma_status_t gma_stream_destroy(gma_t *g, gma_stream_t stream);
/* Blocks until all work queued on stream so far has finished. Memory freed
 * on stream before the call (and gma_record_stream uses of it) is then
 * reusable by every stream at once (under reuse:none, by its own stream, as
 * that policy says), without waiting for gma to observe an event:
 * synchronize through gma rather than the driver where you can. */
GMA_API gma_status_t gma_stream_synchronize(gma_t *g, gma_stream_t stream);

/* Makes the work queued on waiter after this call wait until all the work
 * queued on waitee before the call has finished, without blocking the host:
 * the device orders the two streams, as PyTorch's Stream.wait_stream does
 * (CUDA: an event recorded on waitee and cuStreamWaitEvent on waiter; the
 * simulated device: waiter's thread waits for that point of waitee's queue).
 * Work queued on waitee later is not waited for. GMA_ERR_INVALID_ARGUMENT if
 * g is NULL or destroyed, if waiter and waitee are the same stream (NULL and
 * GMA_STREAM_LEGACY are one stream), if either is not a live stream of g's
 * device (never created, or destroyed), or if either was retired
 * (gma_stream_retire, gma_stream_destroy) and not used with gma since: a
 * retired stream takes no more work. Any thread. */
GMA_API gma_status_t gma_stream_wait_stream(gma_t *g, gma_stream_t waiter, gma_stream_t waitee);

typedef void (*gma_sim_kernel_fn)(void *arg);
/* Queues fn(arg) on a simulated stream: it runs on that stream's own thread
 * after all earlier work on the stream (and earlier waits on events) finished,
 * and later work starts only after it returns. On CUDA: GMA_ERR_UNSUPPORTED. */
GMA_API gma_status_t gma_sim_launch(gma_t *g, gma_stream_t stream, gma_sim_kernel_fn fn,
                                    void *arg);

#ifdef __cplusplus
}
#endif

#endif /* GMA_H */
