#pragma once

// The paths of this checkout and its build that the tests need: fixtures, the stowage tool,
// helper programs, the torch wheel's Python. CMake writes them into a source of the build
// folder (tests/build_paths.cpp.in), not into -D definitions of each test's command: a
// definition that names the checkout keys every unit's compiler-cache entry by it, and a
// clone at another path (CI's) then reuses none of what the working checkout compiled.

#include <string>

namespace stowage::test_paths {

std::string source_dir();   // the checkout
std::string binary_dir();   // the build folder
std::string python();       // the torch wheel's Python; empty when built without it
std::string torchrun();     // its torchrun; empty when built without it
std::string crash_child();  // tests/reliability/crash_child.cpp's program

}  // namespace stowage::test_paths
