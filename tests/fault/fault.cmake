# The fault-injection sweep (tests/fault/test_fault_sweep.c): every device
# call site fails in turn under a representative workload; label "fault", in
# the default suite (ctest -L fault), one test per configuration
# (fault_sweep: the default; fault_sweep_growable, _fallback, _planned), so
# that CTest runs them beside other tests: a sweep mostly waits for
# simulated device work and the worker. The Debug build (full validation after every pool
# operation) fails up to 40 calls of each site; the sanitizer builds, 3-10x
# slower, up to 12 spread over each site's range: every site still fails
# early, in the middle and late under ASan and TSan.
if(GMA_SANITIZE STREQUAL "")
  set(gma_fault_cap 40)
else()
  set(gma_fault_cap 12)
endif()
gma_test(NAME fault_sweep SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fault_sweep.c INTERNAL
  LABELS fault TIMEOUT 300 ARGS --cap ${gma_fault_cap} --config default)
foreach(cfg growable fallback planned)
  gma_test(NAME fault_sweep_${cfg} EXE fault_sweep
    LABELS fault TIMEOUT 300 ARGS --cap ${gma_fault_cap} --config ${cfg})
endforeach()
# The planned sweep is the longest test of every build: started first, it
# runs beside the others instead of after them.
set_tests_properties(fault_sweep_planned PROPERTIES COST 1000)
