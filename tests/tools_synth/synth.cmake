# The synthetic workloads of tools/gma-replay (tools/replay/synth.c), label
# "tools": each workload written with two seeds and parsed back against the
# trace format's rules, and the dp workload replayed on gma (device:sim).
gma_test(NAME tools_synth SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_synth.c LABELS tools
  TIMEOUT 120)
target_sources(tools_synth PRIVATE ${PROJECT_SOURCE_DIR}/tools/replay/synth.c)
target_include_directories(tools_synth PRIVATE ${PROJECT_SOURCE_DIR}/tools/replay)
