# The model-based fuzzer (tests/fuzz/fuzz_gma.c), included by tests/CMakeLists.txt.
#
#   fuzz_replay   always built (any compiler, every build): runs the inputs it is
#                 given through LLVMFuzzerTestOneInput, linking the build's libgma.
#   fuzz_corpus   CTest, label "fuzz" (default suite): replays the seed corpus
#                 (tests/fuzz/corpus) and the fixed bugs' inputs (tests/fuzz/regressions).
#   fuzz_campaign CTest, label "fuzz" (default suite): replays tests/fuzz/campaign,
#                 the merged corpus of the long runs (about 2,200 inputs).
#   fuzz_gma      only when the C compiler is clang and supports -fsanitize=fuzzer
#                 (and no other sanitizer build is selected): the libFuzzer binary,
#                 with gma's runtime compiled into it again with
#                 -fsanitize=fuzzer-no-link,address,undefined so coverage reaches
#                 gma's own code (its own object list, not the gcc-built libgma).
#   fuzz_short    CTest, label "fuzz": 30 s of libFuzzer on a temporary copy of the corpus.
#
#   The trace reader of gma-replay (tools/replay/replay.c) has its own target,
#   fuzz_trace.c (an input is a trace file), built the same three ways:
#   fuzz_trace_replay (always), CTest fuzz_trace_corpus (replays
#   tests/fuzz/trace_corpus), and with libFuzzer fuzz_trace and CTest
#   fuzz_trace_short.
#
# tools/test.sh configures build/fuzz with CC=clang and runs `ctest -L fuzz` there.
set(gma_fuzz_dir ${CMAKE_CURRENT_LIST_DIR})

add_executable(fuzz_replay ${gma_fuzz_dir}/fuzz_gma.c ${gma_fuzz_dir}/replay_main.c)
target_link_libraries(fuzz_replay PRIVATE gma_static)

set(gma_fuzz_inputs ${gma_fuzz_dir}/corpus)
if(EXISTS ${gma_fuzz_dir}/regressions)
  list(APPEND gma_fuzz_inputs ${gma_fuzz_dir}/regressions)
endif()
gma_test(NAME fuzz_corpus EXE fuzz_replay LABELS fuzz TIMEOUT 120 ARGS ${gma_fuzz_inputs})
# The corpus of the long runs on the final code (libFuzzer -merge=1 of two
# 30-minute runs: every input adds coverage), replayed in every build.
if(EXISTS ${gma_fuzz_dir}/campaign)
  gma_test(NAME fuzz_campaign EXE fuzz_replay LABELS fuzz TIMEOUT 600 ARGS ${gma_fuzz_dir}/campaign)
endif()

set(gma_replay_src ${PROJECT_SOURCE_DIR}/tools/replay/replay.c)
add_executable(fuzz_trace_replay ${gma_fuzz_dir}/fuzz_trace.c ${gma_fuzz_dir}/replay_main.c
                                 ${gma_replay_src})
target_include_directories(fuzz_trace_replay PRIVATE ${PROJECT_SOURCE_DIR}/tools/replay)
target_link_libraries(fuzz_trace_replay PRIVATE gma_static)
gma_test(NAME fuzz_trace_corpus EXE fuzz_trace_replay LABELS fuzz TIMEOUT 120
         ARGS ${gma_fuzz_dir}/trace_corpus)

# Minimal reproducers of bugs the fuzzer found (tests/fuzz/crashes/README.md),
# API only; each exits 0 once its bug is fixed. All are fixed now, so they
# run in the default suite (label fuzz) as regression tests, and the crash
# inputs moved to tests/fuzz/regressions (replayed by fuzz_corpus). A new
# finding's reproducer goes into repro/ with its input in crashes/.
file(GLOB gma_fuzz_repros CONFIGURE_DEPENDS ${gma_fuzz_dir}/repro/repro_*.c)
foreach(src ${gma_fuzz_repros})
  get_filename_component(name ${src} NAME_WE)
  gma_test(NAME fuzz_${name} SOURCES ${src} LABELS fuzz TIMEOUT 60)
endforeach()

if(CMAKE_C_COMPILER_ID MATCHES "Clang" AND GMA_SANITIZE STREQUAL "")
  include(CheckCSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS "-fsanitize=fuzzer,address,undefined")
  set(CMAKE_REQUIRED_LINK_OPTIONS "-fsanitize=fuzzer,address,undefined")
  check_c_source_compiles([[
    #include <stddef.h>
    #include <stdint.h>
    int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return d && n ? 0 : 0; }
  ]] GMA_HAVE_LIBFUZZER)
  unset(CMAKE_REQUIRED_FLAGS)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
endif()

if(GMA_HAVE_LIBFUZZER)
  # clang 13 renamed -fsanitize-blacklist to -fsanitize-ignorelist.
  include(CheckCCompilerFlag)
  set(gma_fuzz_ignore ${gma_fuzz_dir}/sanitizer_ignore.txt)
  check_c_compiler_flag(-fsanitize-ignorelist=${gma_fuzz_ignore} GMA_HAVE_SANITIZE_IGNORELIST)
  if(GMA_HAVE_SANITIZE_IGNORELIST)
    set(gma_fuzz_ignore_flag -fsanitize-ignorelist=${gma_fuzz_ignore})
  else()
    set(gma_fuzz_ignore_flag -fsanitize-blacklist=${gma_fuzz_ignore})
  endif()
  set(gma_fuzz_runtime)
  foreach(src ${GMA_RUNTIME_SOURCES})
    list(APPEND gma_fuzz_runtime ${PROJECT_SOURCE_DIR}/${src})
  endforeach()
  # gma's runtime, instrumented for coverage, full structure validation after
  # every operation (GMA_DEBUG=2: a broken invariant aborts, so libFuzzer
  # records it).
  add_library(gma_fuzz_objects OBJECT ${gma_fuzz_runtime})
  target_include_directories(gma_fuzz_objects PUBLIC ${PROJECT_SOURCE_DIR}/include
                                                     ${PROJECT_SOURCE_DIR}/runtime)
  target_compile_definitions(gma_fuzz_objects PUBLIC GMA_DEBUG=2 GMA_STATIC_BUILD)
  target_compile_options(gma_fuzz_objects PRIVATE
    -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined
    -fno-sanitize-recover=undefined ${gma_fuzz_ignore_flag})
  target_link_libraries(gma_fuzz_objects PUBLIC ${gma_ck_target} Threads::Threads ${CMAKE_DL_LIBS})

  add_executable(fuzz_gma ${gma_fuzz_dir}/fuzz_gma.c $<TARGET_OBJECTS:gma_fuzz_objects>)
  target_include_directories(fuzz_gma PRIVATE ${PROJECT_SOURCE_DIR}/include)
  target_compile_definitions(fuzz_gma PRIVATE GMA_STATIC_BUILD)
  target_compile_options(fuzz_gma PRIVATE -O1 -g -fno-omit-frame-pointer
                                          -fsanitize=fuzzer,address,undefined
                                          -fno-sanitize-recover=undefined)
  target_link_options(fuzz_gma PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_gma PRIVATE ${gma_ck_target} Threads::Threads ${CMAKE_DL_LIBS})

  # The trace reader, with replay.c instrumented like the runtime.
  add_executable(fuzz_trace ${gma_fuzz_dir}/fuzz_trace.c ${gma_replay_src}
                            $<TARGET_OBJECTS:gma_fuzz_objects>)
  target_include_directories(fuzz_trace PRIVATE ${PROJECT_SOURCE_DIR}/include
                                                ${PROJECT_SOURCE_DIR}/tools/replay)
  target_compile_definitions(fuzz_trace PRIVATE GMA_STATIC_BUILD)
  target_compile_options(fuzz_trace PRIVATE -O1 -g -fno-omit-frame-pointer
                                            -fsanitize=fuzzer,address,undefined
                                            -fno-sanitize-recover=undefined)
  target_link_options(fuzz_trace PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_trace PRIVATE ${gma_ck_target} Threads::Threads ${CMAKE_DL_LIBS})

  # 30 s of fuzzing on a copy of the corpus (libFuzzer adds what it finds to
  # the directory it is given; the committed corpus stays as it is). Leak
  # checks after every input would cost 4/5 of the throughput (every input
  # starts and ends threads); the ASan build's fuzz_corpus checks leaks at
  # exit instead.
  set(gma_fuzz_work ${CMAKE_CURRENT_BINARY_DIR}/fuzz_short)
  add_test(NAME fuzz_short COMMAND sh -c
    "rm -rf '${gma_fuzz_work}' && mkdir -p '${gma_fuzz_work}/corpus' '${gma_fuzz_work}/artifacts' && cp '${gma_fuzz_dir}'/corpus/* '${gma_fuzz_work}/corpus/' && exec '$<TARGET_FILE:fuzz_gma>' -max_total_time=30 -timeout=60 -rss_limit_mb=4096 -detect_leaks=0 -print_final_stats=1 -artifact_prefix='${gma_fuzz_work}/artifacts/' '${gma_fuzz_work}/corpus'")
  set_tests_properties(fuzz_short PROPERTIES
    TIMEOUT 120
    LABELS fuzz
    ENVIRONMENT "ASAN_OPTIONS=abort_on_error=1;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1;GMA_CONF=")
  # The same for the trace reader, leak checks left on (libFuzzer's default:
  # about 1,100 inputs a second with them on the 2-core machine).
  set(gma_fuzz_trace_work ${CMAKE_CURRENT_BINARY_DIR}/fuzz_trace_short)
  add_test(NAME fuzz_trace_short COMMAND sh -c
    "rm -rf '${gma_fuzz_trace_work}' && mkdir -p '${gma_fuzz_trace_work}/corpus' '${gma_fuzz_trace_work}/artifacts' && cp '${gma_fuzz_dir}'/trace_corpus/* '${gma_fuzz_trace_work}/corpus/' && exec '$<TARGET_FILE:fuzz_trace>' -max_total_time=30 -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix='${gma_fuzz_trace_work}/artifacts/' '${gma_fuzz_trace_work}/corpus'")
  set_tests_properties(fuzz_trace_short PROPERTIES
    TIMEOUT 120
    LABELS fuzz
    ENVIRONMENT "ASAN_OPTIONS=abort_on_error=1;UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1;GMA_CONF=")
endif()
