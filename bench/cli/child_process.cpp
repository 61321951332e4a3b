#include "child_process.h"

#include <stowage/error.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

extern char** environ;

namespace stowage::cli {

bool ChildRun::succeeded() const {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string ChildRun::output_tail() const {
  constexpr size_t kTailChars = 2000;
  return output.substr(output.size() > kTailChars ? output.size() - kTailChars : 0);
}

ChildRun run_child(const std::vector<std::string>& args, const std::string& log,
                   const std::map<std::string, std::string>& environment) {
  std::vector<std::string> variables;
  for (char** variable = environ; *variable != nullptr; ++variable) {
    const std::string text = *variable;
    if (environment.count(text.substr(0, text.find('='))) == 0) variables.push_back(text);
  }
  for (const auto& [name, value] : environment) variables.push_back(name + "=" + value);
  std::vector<char*> envp;
  envp.reserve(variables.size() + 1);
  for (std::string& variable : variables) envp.push_back(variable.data());
  envp.push_back(nullptr);
  std::vector<std::string> strings = args;
  std::vector<char*> argv;
  argv.reserve(strings.size() + 1);
  for (std::string& arg : strings) argv.push_back(arg.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) throw Error(fmt::format("cannot start '{}': {}", args[0], std::strerror(spawned)));
  ChildRun run;
  while (waitpid(pid, &run.status, 0) < 0 && errno == EINTR) {
  }
  std::ifstream in(log);
  std::stringstream output;
  output << in.rdbuf();
  run.output = output.str();
  return run;
}

}  // namespace stowage::cli
