// The `kvbridge` command: demo, bench, bootstrap, status, explain (and the
// internal worker, demo-bootstrap and link-delay).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>

#include "bench/bench.h"
#include "tools/bench_failures.h"
#include "tools/bench_requests.h"
#include "tools/bench_scale.h"
#include "tools/bootstrap_cmd.h"
#include "tools/demo.h"
#include "tools/explain.h"
#include "tools/link_delay.h"
#include "tools/status_cmd.h"
#include "tools/worker.h"

int main(int argc, char** argv) {
  CLI::App app{"kvbridge: KV-cache transfer between prefill and decode workers"};
  app.set_version_flag("--version", std::string("kvbridge ") + KVB_VERSION);
  app.require_subcommand(0, 1);
  std::function<int()> run;
  kvbridge::bench::AddBenchCommands(app, run);
  if (CLI::App* bench = app.get_subcommand("bench")) {
    kvbridge::tools::AddBenchRequestsCommand(*bench, run);
    kvbridge::tools::AddBenchFailuresCommand(*bench, run);
    kvbridge::tools::AddBenchScaleCommand(*bench, run);
  }
  kvbridge::tools::AddDemoCommands(app, run);
  kvbridge::tools::AddWorkerCommand(app, run);
  kvbridge::tools::AddBootstrapCommand(app, run);
  kvbridge::tools::AddStatusCommand(app, run);
  kvbridge::tools::AddExplainCommand(app, run);
  kvbridge::tools::AddLinkDelayCommand(app, run);
  CLI11_PARSE(app, argc, argv);
  if (!run) {
    std::fputs(app.help().c_str(), stdout);
    return app.get_subcommands().empty() ? 0 : 2;
  }
  return run();
}
