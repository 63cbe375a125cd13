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
