# Documentation checks (label docs), each with a planted variant that shows
# the check fails when the documentation and the code disagree:
#   docs_config_keys     docs/config.md's key table against the keys
#                        gma_config_parse accepts (test_config_keys.c)
#   docs_links           every relative link and #anchor in README.md and
#                        docs/**/*.md resolves (check_docs.py links)
#   docs_stats_fields    every field of gma_stats_t and the other statistics
#                        structs in gma.h appears in docs/stats.md
#   docs_error_statuses  every status of GMA_STATUS_MAP appears in docs/errors.md
#   docs_async_batch_example  docs/async.md's gma_alloc_batch_async example,
#                        cut from the page (below) and compiled with -Werror
#                        into example_batch_async.c.in, runs on the simulated
#                        device (planted: on a device too small for it)
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

# The example is the fenced C block after the marker comment in
# docs/async.md. Editing the page reconfigures the build, so the test always
# runs the page's text. Without the marker, or without a block after it, the
# test is registered to fail, saying so, rather than stop the configure.
set(gma_doc ${PROJECT_SOURCE_DIR}/docs/async.md)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${gma_doc})
file(READ ${gma_doc} gma_doc_text)
set(gma_doc_marker "<!-- tests/docs/docs.cmake compiles and runs this example")
string(FIND "${gma_doc_text}" "${gma_doc_marker}" gma_doc_at)
set(gma_doc_example "")
if(gma_doc_at GREATER_EQUAL 0)
  string(SUBSTRING "${gma_doc_text}" ${gma_doc_at} -1 gma_doc_rest)
  string(FIND "${gma_doc_rest}" "```c\n" gma_doc_at)
  if(gma_doc_at GREATER_EQUAL 0)
    math(EXPR gma_doc_at "${gma_doc_at} + 5")
    string(SUBSTRING "${gma_doc_rest}" ${gma_doc_at} -1 gma_doc_rest)
    string(FIND "${gma_doc_rest}" "```" gma_doc_end)
    if(gma_doc_end GREATER 0)
      string(SUBSTRING "${gma_doc_rest}" 0 ${gma_doc_end} gma_doc_example)
    endif()
  endif()
endif()
if(gma_doc_example STREQUAL "")
  add_test(NAME docs_async_batch_example
           COMMAND sh -c "echo 'FAIL: docs/async.md has no C example after \"${gma_doc_marker}\"'; exit 1")
  set_tests_properties(docs_async_batch_example PROPERTIES LABELS docs)
else()
  set(GMA_DOC_EXAMPLE "${gma_doc_example}")
  configure_file(${CMAKE_CURRENT_LIST_DIR}/example_batch_async.c.in
                 ${CMAKE_CURRENT_BINARY_DIR}/docs_async_batch_example.c @ONLY)
  gma_test(NAME docs_async_batch_example
           SOURCES ${CMAKE_CURRENT_BINARY_DIR}/docs_async_batch_example.c LABELS docs)
  target_compile_options(docs_async_batch_example PRIVATE -Werror)
  # Planted: a 4 MiB device refuses the example's 8 MiB block, and the test
  # must say the example failed.
  gma_test(NAME docs_async_batch_example_planted EXE docs_async_batch_example LABELS docs
           ENV GMA_CONF=sim_capacity:4M)
  set_tests_properties(docs_async_batch_example_planted PROPERTIES
    FAIL_REGULAR_EXPRESSION "docs/async.md's gma_alloc_batch_async example: ok"
    PASS_REGULAR_EXPRESSION "FAIL: the example returned GMA_ERR_INVALID_SIZE")
endif()
