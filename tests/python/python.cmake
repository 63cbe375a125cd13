# Tests of the Python binding (python/gma), the PyTorch plug-in
# (plugins/torch) and the CuPy and PyTorch adapters, label "python"; the
# plug-in's teardown in C, label "plugin".
#
# The Python tests load the build's libgma and libgma_torch into the system's
# python. A sanitizer-instrumented libgma would need the sanitizer runtime
# preloaded into that uninstrumented interpreter, so they are registered only
# in builds without GMA_SANITIZE (the Debug build runs them); the C teardown
# test runs in every build, sanitizers included.

gma_test(NAME plugin_torch_exit_threads SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_torch_exit.c
         ARGS threads LABELS plugin TIMEOUT 60)
target_link_libraries(plugin_torch_exit_threads PRIVATE gma_torch)
gma_test(NAME plugin_torch_exit_atexit EXE plugin_torch_exit_threads ARGS atexit
         LABELS plugin TIMEOUT 60)
set_tests_properties(plugin_torch_exit_atexit PROPERTIES
  PASS_REGULAR_EXPRESSION "late calls after the plug-in's atexit handler: harmless")
# The atexit handler abandons the allocators (gma_abandon): the live tensor's
# memory is left to the process's exit, and nothing is reported.

# The C++ OOM shim (plugins/torch/gma_torch_shim.cpp) built against the
# stand-in c10 header (standin_torch/c10/util/Exception.h) instead of
# PyTorch's: plugin_torch_oom calls it as CUDAPluggableAllocator does and
# catches c10::OutOfMemoryError (every build: LeakSanitizer checks the throw
# path in the ASan build); python_torch_oom below loads it through
# gma.torch.use() into a stand-in torch. Never installed, never given to real
# PyTorch (its exception types are not c10's).
if(CMAKE_CXX_COMPILER)
  add_library(gma_torch_shim_standin SHARED ${PROJECT_SOURCE_DIR}/plugins/torch/gma_torch_shim.cpp)
  target_include_directories(gma_torch_shim_standin PRIVATE ${CMAKE_CURRENT_LIST_DIR}/standin_torch)
  target_compile_options(gma_torch_shim_standin PRIVATE -fvisibility=hidden)
  target_link_libraries(gma_torch_shim_standin PRIVATE gma_torch)
  gma_test(NAME plugin_torch_oom SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_torch_oom.cpp
           LABELS plugin TIMEOUT 60)
  target_include_directories(plugin_torch_oom PRIVATE ${CMAKE_CURRENT_LIST_DIR}/standin_torch)
  target_link_libraries(plugin_torch_oom PRIVATE gma_torch_shim_standin gma_torch)
  set(gma_standin_missing "")
else()
  set(gma_standin_missing "no C++ compiler (tools/bootstrap.sh installs g++)")
  add_test(NAME plugin_torch_oom
           COMMAND sh -c "echo 'SKIPPED: ${gma_standin_missing}: the C++ OOM shim was not built'; exit 77")
  set_tests_properties(plugin_torch_oom PROPERTIES LABELS plugin SKIP_RETURN_CODE 77)
endif()

if(NOT GMA_SANITIZE STREQUAL "")
  message(STATUS "gma: the Python tests (label python) are not registered in the "
                 "GMA_SANITIZE=${GMA_SANITIZE} build: an instrumented libgma would need the "
                 "sanitizer runtime preloaded into python; the Debug build runs them")
  return()
endif()
find_package(Python3 COMPONENTS Interpreter OPTIONAL_COMPONENTS Development.Module)
if(NOT Python3_Interpreter_FOUND)
  message(STATUS "gma: no Python 3 interpreter found; the Python tests (label python) are "
                 "not registered")
  return()
endif()

# Prints sizeof and field offsets of the structs python/gma/_lib.py mirrors.
add_executable(gma_py_sizes ${CMAKE_CURRENT_LIST_DIR}/sizes.c)
target_link_libraries(gma_py_sizes PRIVATE gma)

set(gma_py_env
  "GMA_CONF=device:sim"
  "GMA_LIBRARY=$<TARGET_FILE:gma>"
  "GMA_TORCH_LIBRARY=$<TARGET_FILE:gma_torch>"
  "PYTHONPATH=${PROJECT_SOURCE_DIR}/python"
  "PYTHONDONTWRITEBYTECODE=1")
# The stand-in torch._C of python_torch_oom (standin_torch/torch_C.cpp): a C++
# extension module, so the shim's exception crosses C++ frames and is
# translated to a Python exception the way PyTorch's bindings do it.
if(NOT gma_standin_missing AND NOT Python3_Development.Module_FOUND)
  set(gma_standin_missing "no Python ${Python3_VERSION} development headers (Python.h) for the stand-in torch._C")
endif()
if(gma_standin_missing)
  set(gma_torch_oom_env "GMA_STANDIN_TORCH_MISSING=${gma_standin_missing}")
else()
  Python3_add_library(gma_standin_torch_C MODULE WITH_SOABI
                      ${CMAKE_CURRENT_LIST_DIR}/standin_torch/torch_C.cpp)
  target_include_directories(gma_standin_torch_C PRIVATE ${CMAKE_CURRENT_LIST_DIR}/standin_torch)
  set_target_properties(gma_standin_torch_C PROPERTIES OUTPUT_NAME _C
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/standin_torch)
  set(gma_torch_oom_env
    "GMA_STANDIN_TORCH_C=$<TARGET_FILE:gma_standin_torch_C>"
    "GMA_TORCH_SHIM_LIBRARY=$<TARGET_FILE:gma_torch_shim_standin>")
endif()

foreach(t binding sizes estimate torch_plugin adapters cupy torch torch_oom)
  add_test(NAME python_${t}
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_${t}.py
                   $<TARGET_FILE:gma_py_sizes> ${PROJECT_SOURCE_DIR}/include/gma.h)
  set_tests_properties(python_${t} PROPERTIES
    LABELS python
    TIMEOUT 60
    SKIP_RETURN_CODE 77
    ENVIRONMENT "${gma_py_env}")
endforeach()
set_property(TEST python_torch_oom APPEND PROPERTY ENVIRONMENT "${gma_torch_oom_env}")
if(TARGET gma-estimate)
  set_property(TEST python_estimate APPEND PROPERTY ENVIRONMENT "GMA_ESTIMATE=$<TARGET_FILE:gma-estimate>")
endif()

# `pip install ./python` (python/pyproject.toml, the in-tree standard-library
# backend) into a temporary --target, offline; the installed package imported
# from elsewhere finds libgma through GMA_LIBRARY, LD_LIBRARY_PATH and next to
# the package, and allocates on the simulated device. Skips (77) without pip.
add_test(NAME python_pip_install
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_pip_install.py
                 ${PROJECT_SOURCE_DIR} $<TARGET_FILE:gma>)
set_tests_properties(python_pip_install PROPERTIES
  LABELS python
  TIMEOUT 180
  SKIP_RETURN_CODE 77
  ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")
