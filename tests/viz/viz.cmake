# Tests of tools/gma-viz (included by tests/CMakeLists.txt): test_viz.py runs
# the tool on small generated timelines and snapshots and checks the SVG,
# HTML and PNG it writes, its axis titles and its errors on bad input (the PNG
# test skips, saying why, without rsvg-convert). Label "tools"; needs Python 3.
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
  message(STATUS "gma: Python 3 not found; the gma-viz test (tools_viz) is not registered")
  return()
endif()

add_test(NAME tools_viz
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_viz.py
          ${PROJECT_SOURCE_DIR}/tools/gma-viz)
set_tests_properties(tools_viz PROPERTIES TIMEOUT 60 LABELS tools)
