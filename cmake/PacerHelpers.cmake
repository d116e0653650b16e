# pacer_test(NAME SOURCES... LIBS... LABELS...): a GoogleTest binary registered with ctest.
# Each test gets its own TEST_TMPDIR under the build tree (tests create temp dirs inside it).
function(pacer_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "PACER_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
endfunction()

# pacer_fuzz_target(TARGET): with clang and PACER_FUZZ=ON (top-level CMakeLists.txt) the target
# becomes a libFuzzer binary (PACER_LIBFUZZER defined: its own main() is left out); otherwise it
# keeps its main(), which replays a corpus and runs a bounded mutation loop.
function(pacer_fuzz_target target)
  if(PACER_FUZZ AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_definitions(${target} PRIVATE PACER_LIBFUZZER=1)
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer)
    target_link_options(${target} PRIVATE -fsanitize=fuzzer)
  endif()
endfunction()
