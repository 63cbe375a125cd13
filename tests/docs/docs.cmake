# Documentation checks (label docs), each with a planted variant that shows
# the check fails when the documentation and the code disagree:
#   docs_config_keys     docs/config.md's key table against the keys
#                        gma_config_parse accepts (test_config_keys.c)
#   docs_links           every relative link and #anchor in README.md and
#                        docs/**/*.md resolves (check_docs.py links)
#   docs_stats_fields    every field of gma_stats_t and the other statistics
#                        structs in gma.h appears in docs/stats.md
#   docs_error_statuses  every status of GMA_STATUS_MAP appears in docs/errors.md
# tools/test.sh runs them in every build, with the rest of the suite.
gma_test(NAME docs_config_keys SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_config_keys.c INTERNAL
  LABELS docs ARGS ${PROJECT_SOURCE_DIR}/docs/config.md)
gma_test(NAME docs_config_keys_planted EXE docs_config_keys LABELS docs
  ARGS --planted ${PROJECT_SOURCE_DIR}/docs/config.md)

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  foreach(check links stats errors)
    if(check STREQUAL "links")
      set(name docs_links)
    elseif(check STREQUAL "stats")
      set(name docs_stats_fields)
    else()
      set(name docs_error_statuses)
    endif()
    add_test(NAME ${name}
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_docs.py ${check}
                     ${PROJECT_SOURCE_DIR})
    add_test(NAME ${name}_planted
             COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/check_docs.py ${check}
                     ${PROJECT_SOURCE_DIR} --planted)
    set_tests_properties(${name} ${name}_planted PROPERTIES TIMEOUT 60 LABELS docs)
  endforeach()
else()
  message(STATUS "gma: Python 3 missing; the docs_links, docs_stats_fields and "
                 "docs_error_statuses checks are not registered")
endif()
