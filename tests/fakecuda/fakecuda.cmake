# The fake CUDA driver, libgma_fakecuda.so (included by tests/CMakeLists.txt).
# Tests only: never installed, never linked into libgma; gma loads it at run
# time when GMA_CUDA_DRIVER names it. Built only when CMake found the CUDA
# Toolkit, whose cuda.h checks every entry point's prototype.
#
# It carries its own copies of the simulated device and the error table.
# -fvisibility=hidden (with GMA_STATIC_BUILD, so gma.h's GMA_API adds no
# default visibility) keeps them private and -Bsymbolic binds the library's
# calls to its own copies, so they never interpose with libgma's; only the
# cu* entry points and the fakecuda_* controls are exported. -z nodelete
# keeps it loaded after a dlclose, as a driver stays: the simulated streams'
# threads run its code until the process ends.
if(NOT CUDAToolkit_FOUND)
  return()
endif()

add_library(gma_fakecuda SHARED
  ${CMAKE_CURRENT_LIST_DIR}/fakecuda.c
  ${PROJECT_SOURCE_DIR}/runtime/device/sim.c
  ${PROJECT_SOURCE_DIR}/runtime/device/sim_event.c
  ${PROJECT_SOURCE_DIR}/runtime/device/sim_memory.c
  ${PROJECT_SOURCE_DIR}/runtime/device/sim_stream.c
  ${PROJECT_SOURCE_DIR}/runtime/device/sim_cost.c
  ${PROJECT_SOURCE_DIR}/runtime/base/error.c
  ${PROJECT_SOURCE_DIR}/runtime/base/lock.c)
target_include_directories(gma_fakecuda PRIVATE
  ${PROJECT_SOURCE_DIR}/include
  ${PROJECT_SOURCE_DIR}/runtime
  ${CMAKE_CURRENT_LIST_DIR}
  ${CUDAToolkit_INCLUDE_DIRS})
target_compile_definitions(gma_fakecuda PRIVATE GMA_DEBUG=${GMA_DEBUG} GMA_STATIC_BUILD)
target_compile_options(gma_fakecuda PRIVATE -fvisibility=hidden)
target_link_options(gma_fakecuda PRIVATE -Wl,-Bsymbolic -Wl,-z,nodelete)
target_link_libraries(gma_fakecuda PRIVATE Threads::Threads)

# The fake's own semantics, checked through cuGetProcAddress alone (no gma).
# Its misuse checks run ~30 child processes, slow under TSan: a longer timeout.
gma_test(NAME fakecuda_driver SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fakecuda_driver.c
  LABELS fakecuda TIMEOUT 180
  ENV "GMA_CUDA_DRIVER=$<TARGET_FILE:gma_fakecuda>" GMA_FAKECUDA_DEVICES=2
      GMA_FAKECUDA_MEM=64M,128M GMA_FAKECUDA_GRANULARITY=2M)
target_include_directories(fakecuda_driver PRIVATE ${CMAKE_CURRENT_LIST_DIR}
  ${CUDAToolkit_INCLUDE_DIRS})
add_dependencies(fakecuda_driver gma_fakecuda)
