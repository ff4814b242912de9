#include "bench/bench.h"

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/progress_step_bench.h"
#include "bench/transport_bench.h"

namespace kvbridge::bench {
namespace {

// Parses a size flag, throwing CLI11's error type so the CLI reports it.
uint64_t SizeOrThrow(const std::string& flag, const std::string& text) {
  Result<uint64_t> v = ParseSize(text);
  if (!v.ok()) throw CLI::ValidationError(flag, v.status().message());
  return *v;
}

void AddTransportCommands(CLI::App& bench, std::function<int()>& run) {
  struct Flags {
    TransportBenchOptions options;
    std::vector<std::string> block_sizes = {"4K", "64K", "1M", "16M"};
    std::string bytes = "1G";
    std::string region_size = "1G";
    bool no_warmup = false;
    std::string target_wrap;
    // transport-target
    std::string target_path;
    std::string target_region = "1G";
    int in_fd = -1;
    int out_fd = -1;
  };
  auto flags = std::make_shared<Flags>();

  CLI::App* cmd = bench.add_subcommand(
      "transport",
      "One-sided write bandwidth and message rate per transport path between two processes on "
      "this host, next to a memcpy / loopback-socket reference measured in the same run");
  cmd->add_option("--paths", flags->options.paths,
                  "Transport paths: shm, cma, tcp, tcp-granted (writes under a per-peer grant, as "
                  "requests make them), ucx-shm")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--block-sizes", flags->block_sizes, "Block sizes (4K, 64KiB, 1M, ...)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--bytes", flags->bytes, "Bytes written per path and block size")
      ->capture_default_str();
  cmd->add_option("--region-size", flags->region_size, "Source and target region size")
      ->capture_default_str();
  cmd->add_option("--batch", flags->options.batch, "Blocks per write batch")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--depth", flags->options.depth, "Write batches in flight")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--repeat", flags->options.repeat,
                  "Rounds per path and size (each after its own reference); best kept")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_flag("--json", flags->options.json, "Print one JSON object on stdout");
  cmd->add_flag("--no-warmup", flags->no_warmup, "Skip the untimed warm-up pass");
  // `kvbridge bench requests --hosts`: the target on another host.
  cmd->add_option("--target-wrap", flags->target_wrap,
                  "Start the target under this argv prefix (space-separated)")
      ->group("");
  cmd->callback([flags, &run] {
    TransportBenchOptions& o = flags->options;
    o.block_sizes.clear();
    for (const auto& s : flags->block_sizes)
      o.block_sizes.push_back(SizeOrThrow("--block-sizes", s));
    o.bytes = SizeOrThrow("--bytes", flags->bytes);
    o.region_size = SizeOrThrow("--region-size", flags->region_size);
    o.warmup = !flags->no_warmup;
    o.target_wrap.clear();
    std::istringstream words(flags->target_wrap);
    for (std::string w; words >> w;) o.target_wrap.push_back(w);
    run = [flags] { return RunTransportBench(flags->options); };
  });

  // The target process the bench starts (re-executing this binary).
  CLI::App* target = bench.add_subcommand("transport-target", "");
  target->group("");  // hidden from --help
  target->add_option("--path", flags->target_path)->required();
  target->add_option("--region-size", flags->target_region)->required();
  target->add_option("--in-fd", flags->in_fd)->required();
  target->add_option("--out-fd", flags->out_fd)->required();
  target->callback([flags, &run] {
    uint64_t region = SizeOrThrow("--region-size", flags->target_region);
    run = [flags, region] {
      return RunTransportTarget(flags->target_path, region, flags->in_fd, flags->out_fd);
    };
  });
}

void AddProgressStepCommand(CLI::App& bench, std::function<int()>& run) {
  auto o = std::make_shared<ProgressStepOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "progress-step",
      "What naming the transport thread's step costs a pass of the UCX progress loop, next to "
      "the bare pass measured in the same run");
  cmd->add_option("--calls", o->calls, "Progress calls per round and variant")
      ->check(CLI::Range(uint64_t{1000}, uint64_t{1} << 32))
      ->capture_default_str();
  cmd->add_option("--rounds", o->rounds, "Alternating rounds; the best of each kept")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one JSON object on stdout");
  cmd->callback([o, &run] { run = [o] { return RunProgressStepBench(*o); }; });
}

}  // namespace

void AddBenchCommands(CLI::App& app, std::function<int()>& run) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that print figures");
  bench->require_subcommand(1);
  AddTransportCommands(*bench, run);
  AddProgressStepCommand(*bench, run);
}

}  // namespace kvbridge::bench
