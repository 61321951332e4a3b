# The libraries stowage builds with besides LibTorch, each behind one name:
#   stowage_fmt, stowage_xxhash, stowage_uring   (the library; exported with it)
#   nlohmann_json::nlohmann_json, CLI11::CLI11, GTest::gtest / gtest_main / gmock
# By default they are the system's (Debian's -dev packages, scripts/setup.sh).
# STOWAGE_DEPS_DIR names a folder with their headers and googletest's sources, gathered by
# scripts/device_check.sh for a machine that has LibTorch but none of these packages.
#
# fmt: a LibTorch whose include directories hold fmt's headers (PyPI's wheels ship a newer
# fmt than Debian's; Debian's /usr/include holds libfmt-dev's) reaches them ahead of any
# other. stowage then uses those headers, header-only, so that every translation unit
# sees the one fmt the LibTorch's own headers see.

add_library(stowage_fmt INTERFACE)
set(STOWAGE_FMT_HEADER_ONLY OFF)
foreach(dir ${TORCH_INCLUDE_DIRS})
  if(EXISTS "${dir}/fmt/format.h")
    set(STOWAGE_FMT_HEADER_ONLY ON)
  endif()
endforeach()
if(STOWAGE_FMT_HEADER_ONLY)
  target_compile_definitions(stowage_fmt INTERFACE FMT_HEADER_ONLY)
  target_link_libraries(stowage_fmt INTERFACE torch)  # its include directory holds fmt
else()
  find_package(fmt REQUIRED)
  target_link_libraries(stowage_fmt INTERFACE fmt::fmt)
endif()

add_library(stowage_xxhash INTERFACE)
# liburing, for the batch I/O of the swap optimizer's disk tier (src/dcp/storage/batch_io.cpp).
add_library(stowage_uring INTERFACE)
if(STOWAGE_DEPS_DIR)
  target_include_directories(stowage_xxhash SYSTEM INTERFACE $<BUILD_INTERFACE:${STOWAGE_DEPS_DIR}/include>)
  target_compile_definitions(stowage_xxhash INTERFACE XXH_INLINE_ALL)
  target_include_directories(stowage_uring SYSTEM INTERFACE $<BUILD_INTERFACE:${STOWAGE_DEPS_DIR}/include>)
  target_link_libraries(stowage_uring INTERFACE $<BUILD_INTERFACE:${STOWAGE_DEPS_DIR}/lib/liburing.a>)

  foreach(name nlohmann_json::nlohmann_json CLI11::CLI11)
    add_library(${name} INTERFACE IMPORTED)
    target_include_directories(${name} SYSTEM INTERFACE ${STOWAGE_DEPS_DIR}/include)
  endforeach()
  if(STOWAGE_BUILD_TESTS)
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    # Its CMake project defines the GTest:: targets, as find_package(GTest) does.
    add_subdirectory(${STOWAGE_DEPS_DIR}/googletest ${PROJECT_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
  endif()
else()
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
  target_link_libraries(stowage_xxhash INTERFACE PkgConfig::XXHASH)
  # Its x86 dispatch (AVX2/AVX-512 picked at run time), where the library exports it:
  # src/dcp/format/hash_state.h.
  include(CheckSymbolExists)
  set(CMAKE_REQUIRED_INCLUDES ${XXHASH_INCLUDE_DIRS})
  set(CMAKE_REQUIRED_LIBRARIES ${XXHASH_LINK_LIBRARIES})
  check_symbol_exists(XXH3_64bits_dispatch "xxh_x86dispatch.h" STOWAGE_HAVE_XXH3_DISPATCH)
  unset(CMAKE_REQUIRED_INCLUDES)
  unset(CMAKE_REQUIRED_LIBRARIES)
  if(STOWAGE_HAVE_XXH3_DISPATCH)
    target_compile_definitions(stowage_xxhash INTERFACE STOWAGE_XXH3_DISPATCH)
  endif()
  pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)
  target_link_libraries(stowage_uring INTERFACE PkgConfig::URING)
  find_package(nlohmann_json 3.9 REQUIRED)
  if(STOWAGE_BUILD_TOOLS)
    find_package(CLI11 REQUIRED)
  endif()
  if(STOWAGE_BUILD_TESTS)
    find_package(GTest REQUIRED)
  endif()
endif()
