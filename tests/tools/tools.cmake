# Tests of the Python tools in tools/ (label "tools"). They need only a
# Python 3 interpreter, no GPU and no build output. The sixteen real workloads
# ship in traces/ as gma trace CSV (gzip); the PyTorch snapshots they were
# converted from live outside the repository, in GMA_TRACES_DIR: the part of
# tools_import_torch that re-imports them and compares the result with the
# shipped files byte for byte is skipped, saying why, when it is missing.
# tools_import_torch converts all sixteen (about 15 s of CPU in all; a
# minute of wall time on a loaded 2-core machine), hence its timeout.
set(GMA_TRACES_DIR "${PROJECT_SOURCE_DIR}/../shared/traces" CACHE PATH
    "Directory of the PyTorch memory snapshots the tools tests convert")

find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
  message(STATUS "gma: no Python 3 interpreter found; the tools tests (label tools) are not registered")
  return()
endif()

add_test(NAME tools_import_torch
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_import_torch.py
                 ${PROJECT_SOURCE_DIR}/tools/gma-import-torch ${GMA_TRACES_DIR}
                 ${PROJECT_SOURCE_DIR}/traces)
set_tests_properties(tools_import_torch PROPERTIES
  LABELS tools
  TIMEOUT 300
  SKIP_RETURN_CODE 77)

# tools/traces.sh (how tools/main.sh finds its traces) run from a copy of
# the repository with no ../shared beside it: the shipped traces, byte for
# byte, and what GMA_TRACES_DIR adds.
add_test(NAME tools_main_traces
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_main_traces.py
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(tools_main_traces PROPERTIES LABELS tools TIMEOUT 120)

add_test(NAME tools_torch_policy_model
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_torch_policy_model.py
                 ${PROJECT_SOURCE_DIR}/tools/torch-policy-model)
set_tests_properties(tools_torch_policy_model PROPERTIES LABELS tools TIMEOUT 60)

# tools/gpu_check.sh and bench/gpu/torch_train.py skip cleanly without a GPU
# (and torch_train.py without torch, or with a torch that sees no CUDA): exit
# 0 within 10 s, the exact skip line, nothing built or written.
# bench/gpu/torch_bench.py's measuring code on a stand-in torch (no torch or
# GPU on CI): every scenario measured, the cache emptied before each, an OOM
# raised or a NULL tensor counted as a failure, never as a success.
add_test(NAME tools_torch_bench_stub
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_torch_bench.py
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(tools_torch_bench_stub PROPERTIES LABELS tools TIMEOUT 120)

foreach(mode gpu_check torch_train)
  add_test(NAME tools_${mode}_skip
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_gpu_check.py
                   ${mode} ${PROJECT_SOURCE_DIR})
  set_tests_properties(tools_${mode}_skip PROPERTIES LABELS tools TIMEOUT 60)
endforeach()

# tools/gpu_check.sh end to end on the fake CUDA driver (GPU_CHECK_FAKE=1):
# its own Release build of the library, the fake and the GPU tests, the
# probe, the tests, RESULTS.md, and the GPU-only steps skipped with a reason.
# In the unsanitized builds only (it builds and times a Release tree of its
# own, which a sanitizer build would not check any better).
if(TARGET gma_fakecuda AND NOT GMA_SANITIZE)
  add_test(NAME tools_gpu_check_fake
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_gpu_check.py
                   fake ${PROJECT_SOURCE_DIR})
  set_tests_properties(tools_gpu_check_fake PROPERTIES LABELS tools TIMEOUT 300 RUN_SERIAL TRUE)
endif()

# tools/main_summary.py (main.sh's closing summary) on made-up inputs with
# known answers, and on the repository's docs/gpu/RESULTS.md.
add_test(NAME tools_main_summary
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_main_summary.py
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(tools_main_summary PROPERTIES LABELS tools TIMEOUT 60)

# The layer check (tools/layers.py: calls go down, no loop spans folders,
# functions <= 80 lines, .c files <= 800) on runtime/, and a copy of runtime/
# with planted violations on which it must fail.
add_test(NAME tools_layers
         COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/layers.py --root ${PROJECT_SOURCE_DIR})
set_tests_properties(tools_layers PROPERTIES LABELS tools TIMEOUT 60)
add_test(NAME tools_layers_planted
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_layers_planted.py ${PROJECT_SOURCE_DIR})
set_tests_properties(tools_layers_planted PROPERTIES LABELS tools TIMEOUT 120)

# gma-estimate from the outside (tests/tools/test_estimate.py): the table and
# JSON of a model, refusals and usage, --trace's capacity search on a small
# trace, and the estimate of the shipped CS336 trace within 10% of its peak.
if(TARGET gma-estimate)
  add_test(NAME tools_estimate
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_estimate.py
                   $<TARGET_FILE:gma-estimate> ${PROJECT_SOURCE_DIR})
  set_tests_properties(tools_estimate PROPERTIES LABELS tools TIMEOUT 180
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1;TSAN_OPTIONS=suppressions=${GMA_TSAN_SUPPRESSIONS} halt_on_error=1;GMA_CONF=")
endif()
