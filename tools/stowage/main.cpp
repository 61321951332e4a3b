#include "commands.h"
#include "program.h"

int main(int argc, char** argv) {
  CLI::App app;
  stowage::cli::add_commands(app);
  return stowage::cli::run_program(app, "stowage", argc, argv);
}
