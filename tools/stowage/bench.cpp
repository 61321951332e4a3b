// `stowage bench ...`: the benchmarks are a program of their own, stowage-bench (bench/cli),
// built and installed beside this one; `stowage bench ARGS` runs `stowage-bench ARGS`.
#include "commands.h"
#include "launch_ranks.h"

#include <stowage/error.h>

#include <fmt/format.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace stowage::cli {
namespace {

// Replaces this process with stowage-bench, given `arguments`; returns only by throwing.
[[noreturn]] void run_bench_program(const std::vector<std::string>& arguments) {
  const std::string program = (std::filesystem::path(executable_path()).parent_path() / "stowage-bench").string();
  std::vector<std::string> strings{"stowage bench"};  // its argv[0]: the name its usage lines give
  strings.insert(strings.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  argv.reserve(strings.size() + 1);
  for (std::string& string : strings) argv.push_back(string.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  execv(program.c_str(), argv.data());
  throw Error(fmt::format("bench: cannot run the benchmarks' program '{}': {}", program, std::strerror(errno)));
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Run one benchmark, or all of them (one table) without a name: `stowage bench --help` lists them");
  bench->set_help_flag();   // --help too is stowage-bench's
  bench->prefix_command();  // every argument is stowage-bench's
  bench->callback([bench] { run_bench_program(bench->remaining()); });
}

}  // namespace stowage::cli
