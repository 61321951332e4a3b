#include "program.h"

#include <stowage/error.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cstdio>
#include <exception>

namespace stowage::cli {

int run_program(CLI::App& app, const char* program, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {  // a command's own status (train's 75), not an argument's
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every bad argument 2, as a usage error (CLI11's own
    // codes, 100 and up, would read as a command's status).
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const stowage::Error& e) {
    fmt::print(stderr, "{}: {}\n", program, e.what());
    return 1;
  } catch (const c10::OutOfMemoryError& e) {
    fmt::print(stderr, "{}: {}\n", program, e.what_without_backtrace());
    return kOutOfMemoryStatus;
  } catch (const c10::Error& e) {
    fmt::print(stderr, "{}: {}\n", program, e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {  // e.g. std::filesystem's errors, which name the path
    fmt::print(stderr, "{}: {}\n", program, e.what());
    return 1;
  }
  return 0;
}

}  // namespace stowage::cli
