#include "bench/bench.h"

namespace kvbridge::bench {

void AddBenchCommands(CLI::App& app, std::function<int()>& run) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that print figures");
  bench->require_subcommand(1);
}

}  // namespace kvbridge::bench
