/* Prints, as JSON, sizeof and the offset of every field of the structs the
 * Python binding mirrors (python/gma/_lib.py), as this C compiler lays them
 * out; tests/python/test_sizes.py compares them with ctypes. A field added to
 * gma.h changes sizeof even before it is listed here. */
#include <stddef.h>
#include <stdio.h>

#include "gma.h"

static int first_struct = 1, first_field;

static void begin(const char *name, size_t size) {
  printf("%s\n  \"%s\": {\"sizeof\": %zu, \"fields\": {", first_struct ? "{" : ",", name, size);
  first_struct = 0;
  first_field = 1;
}

static void field(const char *name, size_t offset) {
  printf("%s\"%s\": %zu", first_field ? "" : ", ", name, offset);
  first_field = 0;
}

static void end(void) { printf("}}"); }

#define BEGIN(T) begin(#T, sizeof(T))
#define F(T, f) field(#f, offsetof(T, f))

int main(void) {
  BEGIN(gma_config_t);
  F(gma_config_t, size); F(gma_config_t, device); F(gma_config_t, device_ordinal);
  F(gma_config_t, ignore_env); F(gma_config_t, memory_limit); F(gma_config_t, small_size);
  F(gma_config_t, small_segment_size); F(gma_config_t, large_segment_size);
  F(gma_config_t, reuse); F(gma_config_t, bin_max); F(gma_config_t, bin_depth);
  F(gma_config_t, bins_off); F(gma_config_t, sim_capacity);
  F(gma_config_t, sim_alloc_latency_ns); F(gma_config_t, sim_free_latency_ns);
  F(gma_config_t, sim_event_latency_ns); F(gma_config_t, sim_fail_alloc);
  F(gma_config_t, sim_fail_event); F(gma_config_t, trim_interval_ms);
  F(gma_config_t, release_threshold); F(gma_config_t, idle_ms); F(gma_config_t, grow_ahead);
  F(gma_config_t, worker_off); F(gma_config_t, ring_size); F(gma_config_t, future_timeout_ms);
  F(gma_config_t, expandable_segments); F(gma_config_t, trace_path);
  F(gma_config_t, fallback_host); F(gma_config_t, host_release_threshold);
  F(gma_config_t, oom_wait_ms);
  F(gma_config_t, per_thread_default_stream); F(gma_config_t, plan);
  F(gma_config_t, sim_costs);
  end();
  BEGIN(gma_stat_t);
  F(gma_stat_t, current); F(gma_stat_t, peak); F(gma_stat_t, total);
  end();
  BEGIN(gma_stats_t);
  F(gma_stats_t, size); F(gma_stats_t, allocated); F(gma_stats_t, requested);
  F(gma_stats_t, reserved); F(gma_stats_t, active); F(gma_stats_t, cached);
  F(gma_stats_t, stream_cached_bytes); F(gma_stats_t, pending_bytes); F(gma_stats_t, free_bytes);
  F(gma_stats_t, num_allocs); F(gma_stats_t, num_frees); F(gma_stats_t, num_device_allocs);
  F(gma_stats_t, num_device_frees); F(gma_stats_t, num_ooms); F(gma_stats_t, num_oom_retries);
  F(gma_stats_t, hits_bin); F(gma_stats_t, hits_stream); F(gma_stats_t, hits_pool);
  F(gma_stats_t, hits_device); F(gma_stats_t, num_segments); F(gma_stats_t, largest_free_block);
  F(gma_stats_t, fragmentation); F(gma_stats_t, num_streams);
  F(gma_stats_t, num_cross_stream_waits); F(gma_stats_t, num_epoch_events);
  F(gma_stats_t, num_batches); F(gma_stats_t, num_batches_split); F(gma_stats_t, bytes_trimmed);
  F(gma_stats_t, trims_explicit); F(gma_stats_t, trims_timed); F(gma_stats_t, trims_idle);
  F(gma_stats_t, trims_pressure); F(gma_stats_t, grows_worker); F(gma_stats_t, grows_inline);
  F(gma_stats_t, worker_wakeups); F(gma_stats_t, pressure_level);
  F(gma_stats_t, futures_submitted); F(gma_stats_t, futures_ready_at_once);
  F(gma_stats_t, futures_ready); F(gma_stats_t, futures_failed);
  F(gma_stats_t, futures_timed_out); F(gma_stats_t, queue_depth);
  F(gma_stats_t, submit_to_ready_p50_ns); F(gma_stats_t, submit_to_ready_p99_ns);
  F(gma_stats_t, host_allocated); F(gma_stats_t, host_reserved); F(gma_stats_t, num_host_allocs);
  F(gma_stats_t, num_host_frees); F(gma_stats_t, num_fallbacks); F(gma_stats_t, fallback_bytes);
  F(gma_stats_t, num_oom_waits); F(gma_stats_t, plan_state); F(gma_stats_t, plan_hits);
  F(gma_stats_t, plan_misses); F(gma_stats_t, plan_replans); F(gma_stats_t, plan_arena_bytes);
  F(gma_stats_t, plan_lower_bound); F(gma_stats_t, plan_slots); F(gma_stats_t, plan_iterations);
  F(gma_stats_t, graph_pools); F(gma_stats_t, graph_pool_bytes);
  F(gma_stats_t, graph_pool_cached_bytes); F(gma_stats_t, graph_captures);
  F(gma_stats_t, address_ranges); F(gma_stats_t, address_reserved_bytes);
  F(gma_stats_t, kept_bytes); F(gma_stats_t, kept_chunks); F(gma_stats_t, num_device_remaps);
  F(gma_stats_t, num_device_keeps); F(gma_stats_t, num_kept_frees);
  end();
  BEGIN(gma_transformer_t);
  F(gma_transformer_t, size); F(gma_transformer_t, hidden); F(gma_transformer_t, intermediate);
  F(gma_transformer_t, layers); F(gma_transformer_t, vocab); F(gma_transformer_t, heads);
  F(gma_transformer_t, kv_heads); F(gma_transformer_t, seq_len); F(gma_transformer_t, batch);
  F(gma_transformer_t, dtype_bytes); F(gma_transformer_t, act_dtype_bytes);
  F(gma_transformer_t, kv_cache_tokens); F(gma_transformer_t, mode);
  F(gma_transformer_t, attention); F(gma_transformer_t, optimizer);
  F(gma_transformer_t, plain_ffn); F(gma_transformer_t, tied_embeddings);
  F(gma_transformer_t, grads_released); F(gma_transformer_t, step_foreach);
  end();
  BEGIN(gma_estimate_t);
  F(gma_estimate_t, size); F(gma_estimate_t, total_bytes); F(gma_estimate_t, weights_bytes);
  F(gma_estimate_t, weight_copy_bytes); F(gma_estimate_t, kv_cache_bytes);
  F(gma_estimate_t, activation_bytes); F(gma_estimate_t, logits_bytes);
  F(gma_estimate_t, gradient_bytes); F(gma_estimate_t, optimizer_bytes);
  F(gma_estimate_t, step_temp_bytes); F(gma_estimate_t, params);
  F(gma_estimate_t, layer_activation_bytes); F(gma_estimate_t, phase);
  end();
  BEGIN(gma_stream_stats_t);
  F(gma_stream_stats_t, size); F(gma_stream_stats_t, allocs); F(gma_stream_stats_t, frees);
  F(gma_stream_stats_t, hits); F(gma_stream_stats_t, misses);
  F(gma_stream_stats_t, allocated_bytes); F(gma_stream_stats_t, cached_bytes);
  F(gma_stream_stats_t, epoch); F(gma_stream_stats_t, safe_epoch);
  end();
  BEGIN(gma_pointer_info_t);
  F(gma_pointer_info_t, size); F(gma_pointer_info_t, kind); F(gma_pointer_info_t, base);
  F(gma_pointer_info_t, requested); F(gma_pointer_info_t, block_size);
  F(gma_pointer_info_t, stream); F(gma_pointer_info_t, tag);
  end();
  BEGIN(gma_async_options_t);
  F(gma_async_options_t, size); F(gma_async_options_t, timeout_ns);
  F(gma_async_options_t, nonblocking); F(gma_async_options_t, callback);
  F(gma_async_options_t, user); F(gma_async_options_t, worker_only);
  end();
  printf("\n}\n");
  return 0;
}
