# Trace recording and the replay engine (included by tests/CMakeLists.txt).
#   replay_trace_roundtrip  record a workload with trace:PATH, replay it, same peaks
set(gma_replay_dir ${PROJECT_SOURCE_DIR}/tools/replay)
gma_test(NAME replay_trace_roundtrip SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_trace_roundtrip.c
  ${gma_replay_dir}/replay.c LABELS api tools TIMEOUT 120)
target_include_directories(replay_trace_roundtrip PRIVATE ${gma_replay_dir})
