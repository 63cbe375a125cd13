# Trace recording and the replay engine (included by tests/CMakeLists.txt).
#   replay_trace_roundtrip  record a workload with trace:PATH, replay it, same peaks
set(gma_replay_dir ${PROJECT_SOURCE_DIR}/tools/replay)
gma_test(NAME replay_trace_roundtrip SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_trace_roundtrip.c
  ${gma_replay_dir}/replay.c LABELS api tools TIMEOUT 120)
target_include_directories(replay_trace_roundtrip PRIVATE ${gma_replay_dir})

#   replay_capacity  failed allocations counted and left out of the allocated
#                    figures, oom rows attempted, and --min-capacity's bisection
#                    on traces with a known answer (tools/replay)
gma_test(NAME replay_capacity SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_capacity.c
  ${gma_replay_dir}/replay.c LABELS api tools TIMEOUT 60)
target_include_directories(replay_capacity PRIVATE ${gma_replay_dir})

#   replay_cli_capacity  the gma-replay command: failed allocations in the
#                        per-trace table, the summary and the JSON; oom rows;
#                        --min-capacity's tables and JSON; --repeat's
#                        repetitions, marks and per-repetition figures; bad
#                        and hostile rows refused by name, every key value
#                        replayed (needs Python 3)
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND AND TARGET gma-replay)
  add_test(NAME replay_cli_capacity
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_replay_cli.py
            $<TARGET_FILE:gma-replay>)
  set_tests_properties(replay_cli_capacity PROPERTIES TIMEOUT 60 LABELS tools
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1;TSAN_OPTIONS=suppressions=${GMA_TSAN_SUPPRESSIONS} halt_on_error=1;GMA_CONF=")
else()
  message(STATUS "gma: Python 3 or gma-replay missing; replay_cli_capacity is not registered")
endif()

# replay_torch_snapshot (label tools): gma-replay --torch-snapshot's pickle
# (PyTorch's _snapshot() structure) loaded with a restricted unpickler, its
# round trip through tools/gma-import-torch and gma-replay with the same
# peaks, the Python binding's snapshot(format="torch"), and where torch is
# installed torch.cuda._memory_viz reading it. Loads the build's libgma into
# python, so not in sanitizer builds (tests/python/python.cmake says why).
if(Python3_Interpreter_FOUND AND TARGET gma-replay AND GMA_SANITIZE STREQUAL "")
  add_test(NAME replay_torch_snapshot
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_torch_snapshot.py
            $<TARGET_FILE:gma-replay> ${PROJECT_SOURCE_DIR})
  set_tests_properties(replay_torch_snapshot PROPERTIES TIMEOUT 120 LABELS tools
    ENVIRONMENT "GMA_LIBRARY=$<TARGET_FILE:gma>;GMA_CONF=")
endif()

# replay_vm_fields (label tools): the physical-memory fields of a replay's
# JSON (mapped_peak, vm_maps, vm_unmaps, vm_creates, growable) on a small
# trace that grows, trims and grows again, under ordinary and growable
# segments, and --min-capacity's search object with exactly its fields.
if(Python3_Interpreter_FOUND AND TARGET gma-replay)
  add_test(NAME replay_vm_fields
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_replay_vm.py
            $<TARGET_FILE:gma-replay>)
  set_tests_properties(replay_vm_fields PROPERTIES TIMEOUT 120 LABELS tools
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=1:abort_on_error=1;TSAN_OPTIONS=suppressions=${GMA_TSAN_SUPPRESSIONS} halt_on_error=1;GMA_CONF=")
endif()
