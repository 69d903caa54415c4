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
    VLAC_BINARY="$<TARGET_FILE:vlac>")
  add_dependencies(test_${dir} vlac)
  gtest_discover_tests(test_${dir} PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
endfunction()
