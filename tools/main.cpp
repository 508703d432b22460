// moekit command line (work in progress: commands are added by tools/*.cpp).
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"moekit: modular fused Mixture-of-Experts"};
  app.require_subcommand(0, 1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
