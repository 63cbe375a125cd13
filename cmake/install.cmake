# Install rules and the package files: headers, libgma.so (versioned SONAME)
# and libgma.a, a CMake package (find_package(gma CONFIG) gives gma::gma and
# gma::gma_static) and a pkg-config file, the PyTorch plug-in libraries (when
# built) beside libgma, and the tools as commands in bin/ (gma-replay,
# gma-estimate, gma-viz, gma-import-torch, gma-torch-policy-model). Included at the end of
# the top-level CMakeLists.txt, after the targets exist. Nothing test-only is
# installed: not the tests, not the fake CUDA driver, not the benchmarks, not
# gma-demo. tests/install checks both halves (install_consume, install_prefix).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(GMA_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/gma" CACHE STRING
    "Where the CMake package files go, relative to the install prefix")
mark_as_advanced(GMA_INSTALL_CMAKEDIR)

# concurrencykit in the installed link interface. The build links whatever the
# top-level found (PkgConfig::CK, or the gma_ck INTERFACE target of the
# find_library fallback); neither name may leak into the exported targets, since
# the consumer's machine has to find ck for itself. So the exported interface
# names gma::ck instead, which gmaConfig.cmake creates on the consumer's side
# (pkg-config, else find_library). Only INTERFACE_LINK_LIBRARIES changes: the
# libraries themselves still link ${gma_ck_target} (LINK_LIBRARIES), and
# targets in this build still get ${gma_ck_target} through BUILD_INTERFACE.
foreach(t gma gma_static)
  get_target_property(gma_ifc_libs ${t} INTERFACE_LINK_LIBRARIES)
  if(NOT gma_ifc_libs)
    continue()
  endif()
  string(REGEX REPLACE "([][+.*?()^$|\\\\])" "\\\\\\1" gma_ck_re "${gma_ck_target}")
  # An entry is the target itself or wrapped in a generator expression
  # ($<LINK_ONLY:...> for a static library's private dependencies).
  list(TRANSFORM gma_ifc_libs REPLACE "(^|:)${gma_ck_re}(>|$)"
       "\\1$<BUILD_INTERFACE:${gma_ck_target}>$<INSTALL_INTERFACE:gma::ck>\\2")
  set_property(TARGET ${t} PROPERTY INTERFACE_LINK_LIBRARIES "${gma_ifc_libs}")
endforeach()

# --- Libraries and headers ------------------------------------------------------
# Components: "runtime" is what a program linked against libgma.so needs at run
# time (libgma.so.0.1.0 and the libgma.so.0 SONAME link); "development" is the
# rest (libgma.so namelink, libgma.a, headers, CMake and pkg-config files). A
# plain cmake --install installs both.
install(TARGETS gma gma_static EXPORT gmaTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    COMPONENT runtime NAMELINK_COMPONENT development
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# The public headers are include/gma.h and include/gma/*.h (design.md: one
# public header plus gma/version.h); everything under include/ is public.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT development
  FILES_MATCHING PATTERN "*.h")

# --- CMake package ----------------------------------------------------------------
install(EXPORT gmaTargets
  NAMESPACE gma::
  FILE gmaTargets.cmake
  DESTINATION ${GMA_INSTALL_CMAKEDIR}
  COMPONENT development)

# What gmaConfig.cmake needs to know about this build.
set(GMA_CONFIG_THREADS_PREFER_PTHREAD_FLAG ${THREADS_PREFER_PTHREAD_FLAG})
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/gmaConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/gmaConfig.cmake
  INSTALL_DESTINATION ${GMA_INSTALL_CMAKEDIR})
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/cmake/gmaConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/cmake/gmaConfig.cmake
  ${PROJECT_BINARY_DIR}/cmake/gmaConfigVersion.cmake
  DESTINATION ${GMA_INSTALL_CMAKEDIR}
  COMPONENT development)

# --- pkg-config -------------------------------------------------------------------
# include/gma.h includes no ck header, and gma calls no libck function (it uses
# ck's inline header functions: `nm -u libgma.a` lists no ck_ symbol), so a
# program using gma needs none of ck's flags. gma.pc therefore does not name
# ck.pc at all: pkg-config (pkgconf 1.8) resolves Requires.private for
# --cflags too, so naming it there made `pkg-config --cflags gma` fail without
# ck.pc and pass on ck.pc's Cflags (Debian's has -D__x86_64__). Static linking
# gets -lck (with -L where ck is not in a default directory) in Libs.private,
# next to the threads flag and libdl, so that libgma.a keeps linking if a
# later gma calls into libck.
set(gma_pc_libs_private "")
if(gma_ck_target STREQUAL "PkgConfig::CK")
  set(gma_ck_libdirs ${CK_LIBRARY_DIRS})
  set(gma_ck_libnames ${CK_LIBRARIES})
else()
  get_filename_component(gma_ck_libdirs "${CK_LIBRARY}" DIRECTORY)
  set(gma_ck_libnames ck)
endif()
foreach(d ${gma_ck_libdirs})
  if(NOT d IN_LIST CMAKE_C_IMPLICIT_LINK_DIRECTORIES)
    string(APPEND gma_pc_libs_private " -L${d}")
  endif()
endforeach()
foreach(l ${gma_ck_libnames})
  string(APPEND gma_pc_libs_private " -l${l}")
endforeach()
if(CMAKE_THREAD_LIBS_INIT)
  string(APPEND gma_pc_libs_private " ${CMAKE_THREAD_LIBS_INIT}")
endif()
foreach(lib ${CMAKE_DL_LIBS})
  string(APPEND gma_pc_libs_private " -l${lib}")
endforeach()
string(STRIP "${gma_pc_libs_private}" gma_pc_libs_private)

# The prefix is only known at install time (cmake --install --prefix P), so
# the file is configured twice: now for everything but the prefix, then by the
# install step with CMAKE_INSTALL_PREFIX as the install run sees it.
set(gma_pc_prefix "@gma_pc_prefix@")
foreach(d LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${d}}")
    set(gma_pc_${d} "${CMAKE_INSTALL_${d}}")
  else()
    set(gma_pc_${d} "\${prefix}/${CMAKE_INSTALL_${d}}")
  endif()
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/gma.pc.in ${PROJECT_BINARY_DIR}/cmake/gma.pc.in @ONLY)
install(CODE "
  set(gma_pc_prefix \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${PROJECT_BINARY_DIR}/cmake/gma.pc.in\" \"${PROJECT_BINARY_DIR}/cmake/gma.pc\" @ONLY)
" COMPONENT development)
install(FILES ${PROJECT_BINARY_DIR}/cmake/gma.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
  COMPONENT development)

# --- Plug-ins and tools -------------------------------------------------------------
# The PyTorch plug-in (libgma_torch.so, and libgma_torch_shim.so where it was
# built) goes into the same directory as libgma: python/gma/torch.py looks
# beside the libgma it loaded, so an installed gma needs no GMA_TORCH_LIBRARY.
# Their RUNPATH is $ORIGIN (libgma is next to them); gma-replay's and gma-estimate's are
# $ORIGIN/../<libdir>, so the installed commands run without LD_LIBRARY_PATH.
foreach(t gma_torch gma_torch_shim)
  if(TARGET ${t})
    set_target_properties(${t} PROPERTIES INSTALL_RPATH "$ORIGIN")
    install(TARGETS ${t} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
  endif()
endforeach()
foreach(t gma-replay gma-estimate)
  if(TARGET ${t})
    file(RELATIVE_PATH gma_bin_to_lib "/p/${CMAKE_INSTALL_BINDIR}" "/p/${CMAKE_INSTALL_LIBDIR}")
    set_target_properties(${t} PROPERTIES INSTALL_RPATH "$ORIGIN/${gma_bin_to_lib}")
    install(TARGETS ${t} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  endif()
endforeach()
# The Python tools are single files that need only the standard library (and
# find nothing through the source tree), installed under their command names.
foreach(pair "gma-viz:gma-viz" "gma-import-torch:gma-import-torch"
             "torch-policy-model:gma-torch-policy-model")
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 src)
  list(GET pair 1 cmd)
  if(EXISTS ${PROJECT_SOURCE_DIR}/tools/${src})
    install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/${src} RENAME ${cmd}
            DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  endif()
endforeach()
