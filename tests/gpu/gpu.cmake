# Tests of gma's CUDA backend (included by tests/CMakeLists.txt). Each test
# is registered twice:
#   gpu_<name>       label "gpu": the real driver (libcuda.so.1); skipped
#                    (exit 77) on a machine without a CUDA device
#   fakecuda_<name>  label "fakecuda": the fake driver tests/fakecuda builds
#                    on the simulated device, named by GMA_CUDA_DRIVER; only
#                    when the CUDA Toolkit was found (the fake needs cuda.h)
# The tests use gma.h and drv.h only (no cuda.h), so the gpu_* ones build
# everywhere. test_fakecuda_backend drives the fake's fault injection and
# counters, so it exists only as fakecuda_backend_* entries. Stress sizes are
# divided by GMA_STRESS_SCALE (8 under TSan).
set(gma_gpu_dir ${CMAKE_CURRENT_LIST_DIR})
math(EXPR gma_gpu_stress_ops "600 / ${GMA_STRESS_SCALE}")
math(EXPR gma_gpu_pipeline_batches "160 / ${GMA_STRESS_SCALE}")
if(gma_gpu_pipeline_batches LESS 16)
  set(gma_gpu_pipeline_batches 16)
endif()

# The fake's environment, fixed so nothing from the caller's shell leaks in.
set(gma_fake_env "GMA_CUDA_DRIVER=$<TARGET_FILE:gma_fakecuda>" GMA_FAKECUDA_DEVICES=1
    GMA_FAKECUDA_MEM=8G GMA_FAKECUDA_GRANULARITY=2M)

# gma_gpu_test(name source [ARGS a...])
function(gma_gpu_test name src)
  cmake_parse_arguments(G "" "" "ARGS" ${ARGN})
  gma_test(NAME gpu_${name} SOURCES ${gma_gpu_dir}/${src} LABELS gpu ARGS ${G_ARGS})
  target_include_directories(gpu_${name} PRIVATE ${gma_gpu_dir})
  if(NOT CMAKE_VERSION VERSION_LESS 3.22)
    # The real driver, whatever the caller's shell says.
    set_property(TEST gpu_${name} PROPERTY ENVIRONMENT_MODIFICATION "GMA_CUDA_DRIVER=unset:")
  endif()
  if(TARGET gma_fakecuda)
    gma_test(NAME fakecuda_${name} EXE gpu_${name} LABELS fakecuda ARGS ${G_ARGS}
      ENV ${gma_fake_env})
    add_dependencies(gpu_${name} gma_fakecuda) # built whenever its test is
  endif()
endfunction()

gma_gpu_test(api test_gpu_api.c)
gma_gpu_test(stress test_gpu_stress.c ARGS 1 ${gma_gpu_stress_ops} 4 2)
gma_gpu_test(pipeline test_gpu_pipeline.c ARGS 2 ${gma_gpu_pipeline_batches})
gma_gpu_test(capture test_gpu_capture.c)
gma_gpu_test(held test_gpu_held.c)

# The API and pipeline tests again on the fake with the GPU cost preset
# (GMA_FAKECUDA_COSTS): frees wait for the device, events complete after
# their work, every driver call takes its time.
if(TARGET gma_fakecuda)
  gma_test(NAME fakecuda_api_costs EXE gpu_api LABELS fakecuda TIMEOUT 120
    ENV ${gma_fake_env} GMA_FAKECUDA_COSTS=h100)
  gma_test(NAME fakecuda_pipeline_costs EXE gpu_pipeline LABELS fakecuda TIMEOUT 120
    ARGS 2 16 ENV ${gma_fake_env} GMA_FAKECUDA_COSTS=h100)
endif()

# cuda.c through the fake's controls: one process per scenario, since some
# change the driver's environment or its once-only initialization.
if(TARGET gma_fakecuda)
  gma_test(NAME fakecuda_backend_errors SOURCES ${gma_gpu_dir}/test_fakecuda_backend.c
    LABELS fakecuda ARGS errors ENV ${gma_fake_env})
  target_include_directories(fakecuda_backend_errors PRIVATE ${gma_gpu_dir}
    ${PROJECT_SOURCE_DIR}/tests/fakecuda ${CUDAToolkit_INCLUDE_DIRS})
  add_dependencies(fakecuda_backend_errors gma_fakecuda)
  foreach(scenario events growable reuse retired hotpath waitstream contexts outside)
    gma_test(NAME fakecuda_backend_${scenario} EXE fakecuda_backend_errors LABELS fakecuda
      ARGS ${scenario} ENV ${gma_fake_env})
  endforeach()
  # The stress test with epoch gating planted away must find corruption
  # (the held streams' window); the pending-free check is off, since freeing
  # memory under queued copies is exactly the planted bug. Not under TSan:
  # the planted early reuse is a real data race between the fake's copies,
  # which TSan stops the run for before the test can count it.
  if(NOT GMA_SANITIZE STREQUAL "thread")
    gma_test(NAME fakecuda_stress_planted INTERNAL SOURCES ${gma_gpu_dir}/test_gpu_stress.c
      LABELS fakecuda ARGS 7 200 4 2
      ENV ${gma_fake_env} GMA_FAKECUDA_STRICT=handles)
    target_include_directories(fakecuda_stress_planted PRIVATE ${gma_gpu_dir})
    target_compile_definitions(fakecuda_stress_planted PRIVATE GMA_STRESS_PLANT=1)
    add_dependencies(fakecuda_stress_planted gma_fakecuda)
    # The pipeline the same way: its held streams must let it see the reads
    # that early reuse overwrites.
    gma_test(NAME fakecuda_pipeline_planted INTERNAL SOURCES ${gma_gpu_dir}/test_gpu_pipeline.c
      LABELS fakecuda ARGS 2 ${gma_gpu_pipeline_batches}
      ENV ${gma_fake_env} GMA_FAKECUDA_STRICT=handles)
    target_include_directories(fakecuda_pipeline_planted PRIVATE ${gma_gpu_dir})
    target_compile_definitions(fakecuda_pipeline_planted PRIVATE GMA_PIPELINE_PLANT=1)
    add_dependencies(fakecuda_pipeline_planted gma_fakecuda)
  endif()
  # The capture test with gma's capture check planted away: the strict fake
  # must stop the busy case (an epoch event recorded on a capturing stream,
  # then queried). Forks a child, which must die by SIGABRT. Without stream
  # memory operations: an epoch mark's load would never ask the captured
  # event; the check it proves (no close on a capturing stream) is the one
  # both take.
  gma_test(NAME fakecuda_capture_planted INTERNAL SOURCES ${gma_gpu_dir}/test_gpu_capture.c
    LABELS fakecuda ENV ${gma_fake_env} GMA_FAKECUDA_STREAM_MEM_OPS=off)
  target_include_directories(fakecuda_capture_planted PRIVATE ${gma_gpu_dir})
  target_compile_definitions(fakecuda_capture_planted PRIVATE GMA_CAPTURE_PLANT=1)
  add_dependencies(fakecuda_capture_planted gma_fakecuda)
  # The same with the slow path's capture answer kept past its call: the
  # untold case must be stopped by the strict fake (a child, SIGABRT).
  gma_test(NAME fakecuda_capture_planted_stale INTERNAL SOURCES ${gma_gpu_dir}/test_gpu_capture.c
    LABELS fakecuda ENV ${gma_fake_env} GMA_FAKECUDA_STREAM_MEM_OPS=off)
  target_include_directories(fakecuda_capture_planted_stale PRIVATE ${gma_gpu_dir})
  target_compile_definitions(fakecuda_capture_planted_stale PRIVATE GMA_CAPTURE_PLANT=2)
  add_dependencies(fakecuda_capture_planted_stale gma_fakecuda)
  # Growable chunks on a device without GPUDirect RDMA or POSIX fd handles:
  # gma asks for neither (the fake refuses what the device lacks).
  gma_test(NAME fakecuda_backend_growable_plain EXE fakecuda_backend_errors LABELS fakecuda
    ARGS growable ENV ${gma_fake_env} GMA_FAKECUDA_VMM_FEATURES=none)
  # The default segments: growable on a device with virtual memory
  # management, ordinary on one without.
  gma_test(NAME fakecuda_backend_segments EXE fakecuda_backend_errors LABELS fakecuda
    ARGS segments ENV ${gma_fake_env})
  gma_test(NAME fakecuda_backend_segments_novmm EXE fakecuda_backend_errors LABELS fakecuda
    ARGS segments ENV ${gma_fake_env} GMA_FAKECUDA_VMM_FEATURES=off)
  # Two devices of 1 GiB and 4 GiB.
  foreach(scenario devices context)
    gma_test(NAME fakecuda_backend_${scenario} EXE fakecuda_backend_errors LABELS fakecuda
      ARGS ${scenario}
      ENV "GMA_CUDA_DRIVER=$<TARGET_FILE:gma_fakecuda>" GMA_FAKECUDA_DEVICES=2
          GMA_FAKECUDA_MEM=1G,4G GMA_FAKECUDA_GRANULARITY=2M)
  endforeach()
endif()
