# The fault-injection sweep (tests/fault/test_fault_sweep.c): every device
# call site fails in turn under a representative workload; label "fault", in
# the default suite (ctest -L fault).
gma_test(NAME fault_sweep SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fault_sweep.c INTERNAL
  LABELS fault TIMEOUT 300)
