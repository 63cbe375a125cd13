# Stress tests (included by tests/CMakeLists.txt). Each is seeded and sized by
# its arguments; op counts are divided by GMA_STRESS_SCALE (8 under TSan) so a
# sanitizer build runs them smaller. Fixed seeds keep CTest runs repeatable;
# run the executables by hand with other seeds (they print how to rerun).
#
#   stress_streams_smoke    default set ("smoke"): 4 streams x 2 threads, 30000 ops
#   stress_reuse_wait_smoke "smoke": the same under reuse:wait
#   stress_streams          "stress": the same workload, 1,000,000 ops
#   stress_planted_epoch    "smoke": epoch gating removed; must detect corruption
#   stress_planted_record   "smoke": record_stream gating removed; must detect it
#   stream_rotation         "smoke": 64 streams in turn; reserved memory stays bounded
#   stress_expandable_smoke "smoke": the smoke workload on growable segments, with
#                           the worker trimming (unmapping) every 5 ms under it
#   stress_expandable_limit_smoke "smoke": the same under a memory_limit of 360 MiB
#                           (about 60% of what it reserves without one) with the
#                           worker growing 16 MiB ahead: growths of four streams'
#                           own segments, nobody's growth ahead and growths at the
#                           limit that extend any segment race with trims; OOM is
#                           allowed (--oom-ok), wrong memory is not
#   stress_trace_smoke      "smoke": the smoke workload with trace recording on
#                           (8 threads' events into one trace; TSan checks it)
set(gma_stress_src ${CMAKE_CURRENT_LIST_DIR}/stress_streams.c)

math(EXPR gma_stress_smoke_ops "30000 / ${GMA_STRESS_SCALE}")
math(EXPR gma_stress_full_ops "1000000 / ${GMA_STRESS_SCALE}")
# A planted run stops at its first detection, so its op budget is an upper
# bound that costs nothing when the detector works; it is divided by only a
# quarter of the scale because detection needs enough shared blocks to be
# reused (typically 200-2500 ops, occasionally more under TSan).
math(EXPR gma_stress_planted_div "(${GMA_STRESS_SCALE} + 3) / 4")
math(EXPR gma_stress_planted_ops "20000 / ${gma_stress_planted_div}")

gma_test(NAME stress_streams_smoke SOURCES ${gma_stress_src} INTERNAL
  LABELS smoke TIMEOUT 120 ARGS 1 ${gma_stress_smoke_ops} 4 2)
gma_test(NAME stress_expandable_smoke SOURCES ${gma_stress_src} INTERNAL
  LABELS smoke TIMEOUT 120 ARGS 5 ${gma_stress_smoke_ops} 4 2
  --conf expandable_segments:true,trim_interval_ms:5,release_threshold:512,idle_ms:1)
gma_test(NAME stress_expandable_limit_smoke EXE stress_streams_smoke
  LABELS smoke TIMEOUT 120 ARGS 8 ${gma_stress_smoke_ops} 4 2 --oom-ok
  --conf expandable_segments:true,trim_interval_ms:5,release_threshold:512,idle_ms:1,memory_limit:360M,grow_ahead:16M,oom_wait_ms:100)
# reuse:wait: blocks of other streams, cached or freed after record_stream,
# handed out behind device-side waits instead of growing the pool
gma_test(NAME stress_reuse_wait_smoke SOURCES ${gma_stress_src} INTERNAL
  LABELS smoke TIMEOUT 180 ARGS 7 ${gma_stress_smoke_ops} 4 2 --conf reuse:wait)
gma_test(NAME stress_trace_smoke SOURCES ${gma_stress_src} INTERNAL
  LABELS smoke TIMEOUT 120 ARGS 6 ${gma_stress_smoke_ops} 4 2
  --conf trace:${CMAKE_CURRENT_BINARY_DIR}/stress_trace.csv)
gma_test(NAME stress_streams SOURCES ${gma_stress_src} INTERNAL
  LABELS stress TIMEOUT 600 ARGS 2 ${gma_stress_full_ops} 4 2)
gma_test(NAME stress_planted_epoch SOURCES ${gma_stress_src} INTERNAL
  LABELS smoke TIMEOUT 180 ARGS 3 ${gma_stress_planted_ops} 4 2 --plant epoch)
gma_test(NAME stress_planted_record SOURCES ${gma_stress_src} INTERNAL
  LABELS smoke TIMEOUT 180 ARGS 4 ${gma_stress_planted_ops} 4 2 --plant record)

# Async requests served on the submitting thread, by a waiting thread and by
# the worker at once (tests/stress/stress_async.c):
#   stress_async_smoke        "smoke": 4 streams x 2 threads
#   stress_async_limit_smoke  "smoke": the same under a device of 192 MiB, where
#                             requests wait for memory (back-pressure) and may
#                             time out
#   stress_async              "stress": the same workload, 20x the requests
#   stress_planted_claim      "smoke": waiters serve requests without claiming them
#                             from the worker; must detect double completions
math(EXPR gma_stress_async_smoke_ops "16000 / ${GMA_STRESS_SCALE}")
math(EXPR gma_stress_async_full_ops "320000 / ${GMA_STRESS_SCALE}")
set(gma_stress_async_src ${CMAKE_CURRENT_LIST_DIR}/stress_async.c)
gma_test(NAME stress_async_smoke SOURCES ${gma_stress_async_src} INTERNAL
  LABELS smoke TIMEOUT 180 ARGS 11 ${gma_stress_async_smoke_ops} 4 2)
gma_test(NAME stress_async_limit_smoke EXE stress_async_smoke
  LABELS smoke TIMEOUT 180 ARGS 12 ${gma_stress_async_smoke_ops} 4 2
  --conf sim_capacity:192M --timeouts-ok)
gma_test(NAME stress_async EXE stress_async_smoke
  LABELS stress TIMEOUT 600 ARGS 13 ${gma_stress_async_full_ops} 4 2)
# (Under TSan the planted double serve is also a data race on the future,
# which TSan would report and stop at: the run's own detector is what this
# entry shows, so TSan's reports are off for it.)
gma_test(NAME stress_planted_claim EXE stress_async_smoke
  LABELS smoke TIMEOUT 180 ARGS 14 ${gma_stress_async_smoke_ops} 4 2 --plant claim
  ENV TSAN_OPTIONS=report_bugs=0)

gma_test(NAME stream_rotation SOURCES ${CMAKE_CURRENT_LIST_DIR}/rotation.c
  LABELS smoke TIMEOUT 120)

# Soak (tests/stress/soak.c): a time-bounded random workload over 2 streams
# per thread plus 2 shared ones, with phases of rising and falling working
# sets, async requests, batches, tags, host memory, record_stream, trims and
# the worker's timed trimming; a line every --report-s seconds, and checks of
# corruption, errors, bounded reserved memory, stable latency and teardown.
#   soak        "stress;soak": 10 minutes (ctest -L soak); the "stress" label
#               keeps it out of tools/test.sh's default run (-LE '^stress$')
#   soak_smoke  "smoke": 8 seconds, a line every 2 s, 500 ms phases, in every
#               build (time-bounded, so the same under TSan)
gma_test(NAME soak SOURCES ${CMAKE_CURRENT_LIST_DIR}/soak.c
  LABELS stress soak TIMEOUT 900 ARGS --seconds 600 --seed 1)
gma_test(NAME soak_smoke EXE soak
  LABELS smoke TIMEOUT 120 ARGS --seconds 8 --report-s 2 --phase-ms 500 --seed 2)

# Planned memory (tests/stress/stress_plan.c): 3 threads, each its own stream,
# a training-loop iteration with nested lifetimes, blocks also used on a
# stream all threads share, marks through a barrier, deviations and held
# blocks while the plan is active, a shape change half-way (a re-plan).
#   stress_plan          "stress": 64 iterations (48 under TSan)
#   stress_plan_planted  "stress": the plan's cross-stream gate removed
#                        (GMA__TEST_NO_EPOCH_GATING); must detect corruption.
#                        Not under TSan: the planted early reuse is a real
#                        data race between two kernels, which TSan would stop
#                        the run for before the test can count it.
math(EXPR gma_stress_plan_div "(${GMA_STRESS_SCALE} + 3) / 4")
math(EXPR gma_stress_plan_iters "80 - 16 * ${gma_stress_plan_div}")
gma_test(NAME stress_plan SOURCES ${CMAKE_CURRENT_LIST_DIR}/stress_plan.c INTERNAL
  LABELS stress TIMEOUT 300 ARGS 21 ${gma_stress_plan_iters} 3)
if(NOT GMA_SANITIZE STREQUAL "thread")
  gma_test(NAME stress_plan_planted EXE stress_plan
    LABELS stress TIMEOUT 120 ARGS 22 ${gma_stress_plan_iters} 3 --plant)
endif()
