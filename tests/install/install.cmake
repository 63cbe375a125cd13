# install_consume (label install): installs this build into a fresh prefix and
# builds a small consumer against it, with CMake (find_package(gma CONFIG),
# gma::gma and gma::gma_static) and with a plain compiler command line from
# pkg-config (shared and --static), then runs each. Included by
# tests/CMakeLists.txt; the script is test_install.sh. The install directories
# (cmake/install.cmake, included after tests/) are read from the build's
# CMakeCache.txt when the test runs.
find_program(GMA_BASH bash)
if(NOT GMA_BASH)
  message(STATUS "gma: no bash found; the install test (label install) is not registered")
  return()
endif()

# Sanitizer builds: libgma.so needs the sanitizer runtime loaded first and
# libgma.a calls into it, so the consumer is compiled and linked with the same
# -fsanitize flags as this build.
set(gma_consumer_flags "")
if(GMA_SANITIZE STREQUAL "address")
  set(gma_consumer_flags "-fsanitize=address,undefined -fno-omit-frame-pointer")
elseif(GMA_SANITIZE STREQUAL "thread")
  set(gma_consumer_flags "-fsanitize=thread -fno-omit-frame-pointer")
endif()

if(NOT PKG_CONFIG_EXECUTABLE)
  find_program(PKG_CONFIG_EXECUTABLE pkg-config)
endif()

gma_test(NAME install_consume EXE ${GMA_BASH} LABELS install TIMEOUT 180
  ARGS ${CMAKE_CURRENT_LIST_DIR}/test_install.sh
       "--build=${PROJECT_BINARY_DIR}"
       "--source=${PROJECT_SOURCE_DIR}"
       "--work=${CMAKE_CURRENT_BINARY_DIR}/install_consume"
       "--config=$<CONFIG>"
       "--cmake=${CMAKE_COMMAND}"
       "--generator=${CMAKE_GENERATOR}"
       "--make-program=${CMAKE_MAKE_PROGRAM}"
       "--cc=${CMAKE_C_COMPILER}"
       "--cflags=${gma_consumer_flags}"
       "--pkg-config=${PKG_CONFIG_EXECUTABLE}"
       "--version=${PROJECT_VERSION}")

# install_prefix (label install): installs this build into a fresh prefix and
# uses the four commands (gma-import-torch, gma-replay, gma-viz,
# gma-torch-policy-model) and the PyTorch plug-in's lookup from there, with no
# environment pointing into the build or source tree (test_install_prefix.sh).
# Not in sanitizer builds: the installed gma-replay and libgma would need the
# sanitizer runtime preloaded into the tools' python.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND AND GMA_SANITIZE STREQUAL "")
  gma_test(NAME install_prefix EXE ${GMA_BASH} LABELS install TIMEOUT 180
    ARGS ${CMAKE_CURRENT_LIST_DIR}/test_install_prefix.sh
         "--build=${PROJECT_BINARY_DIR}"
         "--source=${PROJECT_SOURCE_DIR}"
         "--work=${CMAKE_CURRENT_BINARY_DIR}/install_prefix"
         "--config=$<CONFIG>"
         "--cmake=${CMAKE_COMMAND}"
         "--python=${Python3_EXECUTABLE}")
endif()
