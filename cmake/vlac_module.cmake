# vlac_module(NAME DEPS...): one static library per src/ folder, sources globbed,
# so adding a file needs no CMake edit and a broken module does not block the others.
function(vlac_module name)
  file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${name}/*.cpp)
  add_library(vlac_${name} STATIC ${_srcs})
  target_include_directories(vlac_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include)
  target_compile_options(vlac_${name} PRIVATE ${VLAC_WARNINGS})
  target_link_libraries(vlac_${name} PUBLIC ${ARGN})
  set_target_properties(vlac_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

# Cross builds (the aarch64 preset) run target programs under CMAKE_CROSSCOMPILING_EMULATOR. The
# CLI tests start `vlac` themselves through /bin/sh, so they get a wrapper that runs it there too,
# and test discovery waits for ctest (PRE_TEST) rather than running each binary under qemu while
# it builds.
if(CMAKE_CROSSCOMPILING AND CMAKE_CROSSCOMPILING_EMULATOR)
  list(JOIN CMAKE_CROSSCOMPILING_EMULATOR " " _emu)
  file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/vlac-emu
       CONTENT "#!/bin/sh\nexec ${_emu} \"$<TARGET_FILE:vlac>\" \"$@\"\n"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  set(VLAC_TEST_BINARY ${PROJECT_BINARY_DIR}/vlac-emu)
  set(VLAC_TEST_DISCOVERY PRE_TEST)
else()
  set(VLAC_TEST_BINARY "$<TARGET_FILE:vlac>")
  set(VLAC_TEST_DISCOVERY POST_BUILD)
endif()

# vlac_test_dir(DIR LIBS...): every *_test.cpp in tests/DIR becomes one gtest binary.
function(vlac_test_dir dir)
  file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${dir}/*_test.cpp)
  if(NOT _srcs)
    return()
  endif()
  add_executable(test_${dir} ${_srcs})
  target_compile_options(test_${dir} PRIVATE ${VLAC_WARNINGS})
  target_include_directories(test_${dir} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(test_${dir} PRIVATE ${ARGN} GTest::gtest GTest::gtest_main)
  target_compile_definitions(test_${dir} PRIVATE
    VLAC_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    VLAC_BINARY="${VLAC_TEST_BINARY}")
  add_dependencies(test_${dir} vlac)
  gtest_discover_tests(test_${dir} PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60
                       DISCOVERY_MODE ${VLAC_TEST_DISCOVERY})
endfunction()
