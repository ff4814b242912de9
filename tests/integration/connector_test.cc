// The connector end to end: prefill and decode instances as real `kvbridge
// worker` processes (tools/cluster.h) moving KV over UCX or the same-host
// paths. Every decode rank checks every byte of every destination page
// against the pattern of (room, buffer, page position, token, head).
//
// Layouts are small (2 layers, 8 kv heads x 16 dim) so the whole file stays
// well under three minutes on a loaded 2-core machine; one case uses the
// benchmark's model layout.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "connector/kv_pool.h"
#include "tools/cluster.h"

namespace kvbridge::tools {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

const std::vector<std::string> kSmallLayout = {"--layers",   "2",  "--heads",     "8",
                                               "--head-dim", "16", "--page-size", "16"};

std::string Binary() { return std::string(KVB_BIN_DIR) + "/kvbridge"; }

struct Outcome {
  std::vector<json> reports;  // by rank index
  std::vector<ExitInfo> exits;
  std::string log_dir;
};

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Starts the cluster, waits for every REPORT, closes stdin and reaps.
// Fails the test (and returns false) on any launcher error.
bool RunCluster(ClusterOptions o, Outcome* out, std::chrono::milliseconds timeout = 90s) {
  o.binary = Binary();
  o.ready_timeout = 60s;
  auto c = Cluster::Start(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return false;
  Status s = (*c)->CollectReports(timeout);
  EXPECT_TRUE(s.ok()) << s.ToString();
  (*c)->Shutdown(20s);
  out->log_dir = o.log_dir;
  for (int i = 0; i < (*c)->num_ranks(); ++i) {
    const ProcessInfo& p = (*c)->process(i);
    EXPECT_TRUE(p.report.has_value()) << p.name << " sent no REPORT (" << p.exit.ToString() << ")";
    out->reports.push_back(p.report.value_or(json::object()));
    out->exits.push_back(p.exit);
  }
  return s.ok();
}

// Every room succeeded on this rank, nothing corrupt, nothing left live.
void ExpectClean(const json& r, int requests, const std::string& what) {
  SCOPED_TRACE(what + ": " + r.value("rank", json::object()).value("name", std::string("?")));
  EXPECT_EQ(r.value("requests", -1), requests);
  EXPECT_EQ(r.value("succeeded", -1), requests) << r["failures"].dump(2);
  EXPECT_EQ(r.value("failed", -1), 0) << r["failures"].dump(2);
  EXPECT_EQ(r.value("nonterminal", -1), 0);
  EXPECT_EQ(r.value("corrupt_pages", -1), 0);
  EXPECT_EQ(r["stats_after"].value("rooms_live", -1), 0);
  if (r["rank"].value("role", "") == "decode") {
    EXPECT_GT(r.value("verified_pages", 0), 0);
  }
}

void ExpectAllClean(const Outcome& o, int requests, const std::string& what) {
  for (const json& r : o.reports) ExpectClean(r, requests, what);
  for (const ExitInfo& e : o.exits) EXPECT_EQ(e.ToString(), "exit 0") << what;
}

std::string MakeLogDir() {
  char tmpl[] = "/tmp/kvbridge-itest-XXXXXX";
  return mkdtemp(tmpl) ? std::string(tmpl) : std::string();
}

// The data paths the ranks logged ("connected to ... via shm[: ...]"), the
// word after "via": prefill and decode ranks both name it (a "?" is a path
// nobody named, and fails the caller's check).
std::set<std::string> LoggedPaths(const std::string& dir) {
  std::set<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path());
    std::string line;
    while (std::getline(in, line)) {
      size_t at = line.find(" via ");
      if (line.find("] connected to ") == std::string::npos || at == std::string::npos) continue;
      std::string word = line.substr(at + 5);
      word = word.substr(0, word.find_first_of(": "));
      paths.insert(word);
    }
  }
  return paths;
}

// --- Tensor parallel layouts -------------------------------------------

struct TpCase {
  const char* name;
  int prefill_tp;
  int decode_tp;
  bool mla;
};

void PrintTo(const TpCase& c, std::ostream* os) { *os << c.name; }

class ConnectorTp : public ::testing::TestWithParam<TpCase> {};

TEST_P(ConnectorTp, EveryPageLandsVerified) {
  const TpCase& tc = GetParam();
  const int requests = 16;
  ClusterOptions o;
  o.prefill_tp = tc.prefill_tp;
  o.decode_tp = tc.decode_tp;
  o.worker_args = Concat(
      kSmallLayout, {"--requests", std::to_string(requests), "--concurrency", "4", "--min-tokens",
                     "16", "--max-tokens", "512", "--chunk-tokens", "128", "--pool-pages", "256"});
  if (tc.mla) o.worker_args.push_back("--mla");
  Outcome out;
  ASSERT_TRUE(RunCluster(o, &out));
  ExpectAllClean(out, requests, tc.name);
  if (tc.mla) {
    // One prefill rank sends to each decode rank; the others are dummies
    // that still conclude with Success (checked above) without writing.
    uint64_t written = 0;
    int writers = 0;
    for (int i = 0; i < tc.prefill_tp; ++i) {
      uint64_t b = out.reports[i]["stats"].value("bytes_written", uint64_t{0});
      written += b;
      writers += b > 0;
    }
    uint64_t received = 0;
    for (int i = tc.prefill_tp; i < tc.prefill_tp + tc.decode_tp; ++i)
      received += out.reports[i].value("bytes", uint64_t{0});
    EXPECT_GE(written, received);
    EXPECT_LE(writers, tc.decode_tp);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ConnectorTp,
    ::testing::Values(TpCase{"mha_1to1", 1, 1, false}, TpCase{"mha_2to2", 2, 2, false},
                      TpCase{"mha_1to2", 1, 2, false}, TpCase{"mha_2to1", 2, 1, false},
                      TpCase{"mha_4to2", 4, 2, false}, TpCase{"mla_2to2", 2, 2, true},
                      // Wide fan-out and fan-in (issue 14): a prefill rank's
                      // heads split over two decode ranks, and four prefill
                      // ranks' heads gathered into one decode rank.
                      TpCase{"mha_4to8", 4, 8, false}, TpCase{"mha_8to2", 8, 2, false},
                      TpCase{"mla_4to8", 4, 8, true}, TpCase{"mla_8to2", 8, 2, true}),
    [](const auto& info) { return std::string(info.param.name); });

// --- Pipeline parallel layouts -------------------------------------------

// Prefill stages as processes of their own, each holding its stage's layers
// (LayersOfStage) and writing them into decode's matching layers; the
// pattern is keyed by the model layer, so a page in the wrong layer is
// corrupt. 3 layers split 2 + 1: an uneven split. Decode pp 1 gathers every
// stage; decode pp 2 pairs stage s with stage s.
struct PpCase {
  const char* name;
  int prefill_tp;
  int prefill_pp;
  int decode_tp;
  int decode_pp;
};

void PrintTo(const PpCase& c, std::ostream* os) { *os << c.name; }

class ConnectorPp : public ::testing::TestWithParam<PpCase> {};

TEST_P(ConnectorPp, EveryStageLandsVerifiedInItsLayers) {
  const PpCase& pc = GetParam();
  const int requests = 12, layers = 3;
  ClusterOptions o;
  o.prefill_tp = pc.prefill_tp;
  o.prefill_pp = pc.prefill_pp;
  o.decode_tp = pc.decode_tp;
  o.decode_pp = pc.decode_pp;
  o.worker_args = {"--layers",       std::to_string(layers),
                   "--heads",        "8",
                   "--head-dim",     "16",
                   "--page-size",    "16",
                   "--requests",     std::to_string(requests),
                   "--concurrency",  "4",
                   "--min-tokens",   "16",
                   "--max-tokens",   "512",
                   "--chunk-tokens", "128",
                   "--pool-pages",   "256"};
  Outcome out;
  ASSERT_TRUE(RunCluster(o, &out));
  const int prefill_ranks = pc.prefill_pp * pc.prefill_tp;
  ASSERT_EQ(out.reports.size(), static_cast<size_t>(prefill_ranks + pc.decode_pp * pc.decode_tp));
  ExpectAllClean(out, requests, pc.name);

  // Each process is the rank it was started as (pp-major indices).
  for (size_t i = 0; i < out.reports.size(); ++i) {
    const bool prefill = static_cast<int>(i) < prefill_ranks;
    const int side = prefill ? static_cast<int>(i) : static_cast<int>(i) - prefill_ranks;
    const int tp = prefill ? pc.prefill_tp : pc.decode_tp;
    const json& rank = out.reports[i]["rank"];
    EXPECT_EQ(rank.value("role", ""), prefill ? "prefill" : "decode") << i;
    EXPECT_EQ(rank.value("tp", -1), side % tp) << i;
    EXPECT_EQ(rank.value("pp", -1), side / tp) << i;
  }

  // Every stage wrote exactly its layers' share of the pages decode
  // verified, and nothing else: page bytes are proportional to a stage's
  // layer count; on top of them the last stage a decode rank reads writes
  // one aux row per room to it (every stage to its own decode stage under
  // decode pp = prefill pp; the worker's aux rows are ModelShape's default
  // size; no state).
  uint64_t received = 0;
  for (int i = prefill_ranks; i < static_cast<int>(out.reports.size()); ++i)
    received += out.reports[i].value("bytes", uint64_t{0});
  ASSERT_GT(received, 0u);
  const uint64_t aux =
      static_cast<uint64_t>(internal::ModelShape{}.aux_item_len) * requests * pc.decode_tp;
  uint64_t written = 0;
  for (int pp = 0; pp < pc.prefill_pp; ++pp) {
    uint64_t stage = 0;
    for (int tp = 0; tp < pc.prefill_tp; ++tp)
      stage += out.reports[pp * pc.prefill_tp + tp]["stats"].value("bytes_written", uint64_t{0});
    if (pp == pc.prefill_pp - 1 || pc.decode_pp == pc.prefill_pp) {
      ASSERT_GE(stage, aux);
      stage -= aux;
    }
    const int stage_layers = internal::LayersOfStage(layers, pc.prefill_pp, pp).count;
    EXPECT_EQ(stage * layers, received * stage_layers) << "stage " << pp;
    written += stage;
  }
  EXPECT_EQ(written, received);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ConnectorPp,
                         ::testing::Values(PpCase{"pp2tp1_to_pp1tp1", 1, 2, 1, 1},
                                           PpCase{"pp2tp2_to_pp1tp2", 2, 2, 2, 1},
                                           PpCase{"pp2tp1_to_pp2tp1", 1, 2, 1, 2}),
                         [](const auto& info) { return std::string(info.param.name); });

// The benchmark's model layout (32 layers, 8 kv heads x 128 x 2 bytes, page
// 16), tp 2 -> 2, a few requests up to 1k tokens.
TEST(Connector, ModelLayoutTp2To2) {
  const int requests = 6;
  ClusterOptions o;
  o.prefill_tp = 2;
  o.decode_tp = 2;
  o.worker_args = {"--requests",     std::to_string(requests),
                   "--concurrency",  "3",
                   "--min-tokens",   "16",
                   "--max-tokens",   "1024",
                   "--chunk-tokens", "256",
                   "--pool-pages",   "256",
                   "--shm"};
  Outcome out;
  ASSERT_TRUE(RunCluster(o, &out));
  ExpectAllClean(out, requests, "model layout");
}

// --- Request shapes ------------------------------------------------------

// Several chunks per request: 64-token chunks of requests up to 640 tokens.
TEST(Connector, ChunkedPrefill) {
  const int requests = 12;
  ClusterOptions o;
  o.worker_args = Concat(
      kSmallLayout, {"--requests", std::to_string(requests), "--min-tokens", "200", "--max-tokens",
                     "640", "--chunk-tokens", "64", "--concurrency", "4", "--pool-pages", "256"});
  Outcome out;
  ASSERT_TRUE(RunCluster(o, &out));
  ExpectAllClean(out, requests, "chunked");
  // At least ceil(200 / 64) = 4 chunks for every request.
  EXPECT_GE(out.reports[0]["stats"].value("chunks_sent", 0), 4 * requests);
}

// 1,000 one-page rooms in flight at once.
TEST(Connector, ThousandConcurrentRooms) {
  const int requests = 1000;
  ClusterOptions o;
  o.worker_args = Concat(kSmallLayout, {"--requests", std::to_string(requests), "--concurrency",
                                        "1000", "--min-tokens", "1", "--max-tokens", "16",
                                        "--pool-pages", "1100", "--chunk-tokens", "16"});
  Outcome out;
  ASSERT_TRUE(RunCluster(o, &out, 120s));
  ExpectAllClean(out, requests, "1000 rooms");
}

// Room ids wrap to 1..8 with 4 in flight: every id is reused ~8 times, a
// new generation each time; stale data never verifies as the new room's.
TEST(Connector, RoomReuse) {
  const int requests = 64;
  ClusterOptions o;
  o.prefill_tp = 2;
  o.decode_tp = 2;
  o.worker_args = Concat(kSmallLayout, {"--requests", std::to_string(requests), "--room-mod", "8",
                                        "--concurrency", "4", "--min-tokens", "16", "--max-tokens",
                                        "256", "--chunk-tokens", "64", "--pool-pages", "128"});
  Outcome out;
  ASSERT_TRUE(RunCluster(o, &out));
  ExpectAllClean(out, requests, "room reuse");
}

// --- Transports ----------------------------------------------------------

struct PathCase {
  const char* name;
  std::vector<std::string> args;
  const char* expect_path;  // substring of the logged path
};

void PrintTo(const PathCase& c, std::ostream* os) { *os << c.name; }

class ConnectorPath : public ::testing::TestWithParam<PathCase> {};

TEST_P(ConnectorPath, MovesVerifiedPages) {
  const PathCase& pc = GetParam();
  const int requests = 12;
  ClusterOptions o;
  o.prefill_tp = 2;
  o.decode_tp = 2;
  o.worker_args =
      Concat(kSmallLayout, {"--requests", std::to_string(requests), "--min-tokens", "16",
                            "--max-tokens", "512", "--chunk-tokens", "128", "--pool-pages", "256"});
  o.worker_args = Concat(o.worker_args, pc.args);
  o.log_dir = MakeLogDir();
  ASSERT_FALSE(o.log_dir.empty());
  o.env = {"KVBRIDGE_LOG_LEVEL=info"};
  Outcome out;
  ASSERT_TRUE(RunCluster(o, &out));
  ExpectAllClean(out, requests, pc.name);
  std::set<std::string> paths = LoggedPaths(o.log_dir);
  ASSERT_FALSE(paths.empty()) << "no 'connected to ... via' line in " << o.log_dir;
  for (const std::string& p : paths)
    EXPECT_NE(p.find(pc.expect_path), std::string::npos) << "logged path " << p;
  // An operator reads one line per peer on each side, not one per region.
  for (const auto& entry : std::filesystem::directory_iterator(o.log_dir)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("prefill") && !name.starts_with("decode")) continue;
    std::ifstream in(entry.path());
    std::string line;
    int connected = 0, per_region = 0;
    while (std::getline(in, line)) {
      connected += line.find("] connected to ") != std::string::npos;
      per_region += line.find(" -> path ") != std::string::npos;
    }
    EXPECT_GE(connected, 1) << name << " never said which path it uses";
    EXPECT_EQ(per_region, 0) << name << " logged its peer's regions one by one";
  }
  std::filesystem::remove_all(o.log_dir);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, ConnectorPath,
    ::testing::Values(PathCase{"ucx_tcp", {"--ucx-only", "--ucx-tls", "tcp"}, "ucx"},
                      PathCase{"same_host_shm", {"--shm"}, "shm"},
                      PathCase{"same_host_default", {}, "cma"}),
    [](const auto& info) { return std::string(info.param.name); });

// --- Abort with quiescence ---------------------------------------------

// Decode aborts every 3rd room right after SendMetadata, waits for
// Quiesced(), scrubs the pages and hands them out again. The worker counts a
// scrubbed page that no longer holds the filler when reused (a write that
// landed after the signal) as corrupt, and verifies the later rooms that
// land in those pages.
TEST(Connector, AbortMidTransferQuiescesBeforeReuse) {
  const int requests = 30, every = 3;
  ClusterOptions o;
  o.worker_args =
      Concat(kSmallLayout, {"--requests", std::to_string(requests), "--concurrency", "6",
                            "--min-tokens", "64", "--max-tokens", "512", "--chunk-tokens", "64",
                            "--pool-pages", "96", "--waiting-timeout-ms", "10000"});
  o.decode_args = {"--abort-every", std::to_string(every)};
  Outcome out;
  ASSERT_TRUE(RunCluster(o, &out));
  ASSERT_EQ(out.reports.size(), 2u);
  const json& prefill = out.reports[0];
  const json& decode = out.reports[1];

  std::set<uint64_t> aborted;
  for (int i = every; i <= requests; i += every) aborted.insert(i);
  EXPECT_EQ(decode.value("failed", -1), static_cast<int>(aborted.size()));
  EXPECT_EQ(decode.value("succeeded", -1), requests - static_cast<int>(aborted.size()));
  for (const json& r : {prefill, decode}) {
    SCOPED_TRACE(r["rank"].value("name", std::string("?")));
    EXPECT_EQ(r.value("nonterminal", -1), 0);
    EXPECT_EQ(r.value("unquiesced", -1), 0);
    EXPECT_EQ(r.value("corrupt_pages", -1), 0);
    EXPECT_EQ(r["stats_after"].value("rooms_live", -1), 0);
    EXPECT_EQ(r.value("succeeded", 0) + r.value("failed", 0), requests);
    for (const json& f : r["failures"]) {
      EXPECT_TRUE(aborted.count(f.value("room", uint64_t{0}))) << f.dump();
      EXPECT_EQ(f.value("cause", ""), "aborted") << f.dump();
      EXPECT_EQ(f["origin"].value("role", ""), "decode") << f.dump();
      EXPECT_EQ(f["origin"].value("tp", -1), 0) << f.dump();
    }
  }
  EXPECT_GT(decode.value("verified_pages", 0), 0);
  for (const ExitInfo& e : out.exits) EXPECT_EQ(e.ToString(), "exit 0");
}

// --- The launcher itself ---------------------------------------------------

// Ranks come up with their identity, can be stopped, resumed and killed by
// index, and the launcher reports how each one ended.
TEST(Cluster, SignalsAndReapsByIndex) {
  ClusterOptions o;
  o.binary = Binary();
  o.prefill_tp = 1;
  o.decode_tp = 2;
  o.worker_args = Concat(kSmallLayout, {"--requests", "0"});
  auto c = Cluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Cluster& cl = **c;
  ASSERT_EQ(cl.num_ranks(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(cl.process(i).ready.value("pid", -1), cl.process(i).pid);
    EXPECT_EQ(cl.process(i).ready.value("name", ""), cl.process(i).name);
  }
  EXPECT_EQ(cl.process(1).name, "decode tp0");
  ASSERT_TRUE(cl.CollectReports(30s).ok());
  ASSERT_TRUE(cl.Signal(1, SIGSTOP).ok());
  EXPECT_GT(cl.process(1).signalled_at_us, 0);
  ASSERT_TRUE(cl.Signal(2, SIGKILL).ok());
  ASSERT_TRUE(cl.PumpUntil([&] { return cl.process(2).stdout_closed; }, 10s).ok());
  cl.Shutdown(20s);  // resumes rank 1, closes stdin
  EXPECT_EQ(cl.process(0).exit.ToString(), "exit 0");
  EXPECT_EQ(cl.process(1).exit.ToString(), "exit 0");
  EXPECT_TRUE(cl.process(2).exit.reaped);
  EXPECT_FALSE(cl.process(2).exit.exited);
  EXPECT_EQ(cl.process(2).exit.signal, SIGKILL);
  EXPECT_EQ(Cluster::Start(ClusterOptions{}).status().code(), StatusCode::kInvalidArgument);
}

// With pp > 1 every (pp, tp) rank is a process of its own, named and
// indexed by its position: prefill stage 0 then stage 1, then decode.
TEST(Cluster, PipelineStagesAreRanksOfTheirOwn) {
  ClusterOptions o;
  o.binary = Binary();
  o.prefill_tp = 2;
  o.prefill_pp = 2;
  o.decode_tp = 1;
  o.worker_args = Concat(kSmallLayout, {"--requests", "0"});
  auto c = Cluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Cluster& cl = **c;
  ASSERT_EQ(cl.num_ranks(), 5);
  EXPECT_EQ(cl.prefill_ranks(), 4);
  EXPECT_EQ(cl.RankIndex(Role::kPrefill, 1, 0), 1);
  EXPECT_EQ(cl.RankIndex(Role::kPrefill, 0, 1), 2);
  EXPECT_EQ(cl.RankIndex(Role::kDecode, 0), 4);
  for (int i = 0; i < cl.num_ranks(); ++i) {
    const ProcessInfo& p = cl.process(i);
    EXPECT_EQ(p.ready.value("name", ""), p.name);
    EXPECT_EQ(p.ready.value("tp", -1), p.tp) << p.name;
    EXPECT_EQ(p.ready.value("pp", -1), p.pp) << p.name;
  }
  EXPECT_EQ(cl.process(cl.RankIndex(Role::kPrefill, 1, 1)).name, "prefill tp1 pp1");
  EXPECT_EQ(cl.process(cl.RankIndex(Role::kPrefill, 1, 0)).name, "prefill tp1");
  ASSERT_TRUE(cl.CollectReports(30s).ok());
  cl.Shutdown(20s);
  for (int i = 0; i < cl.num_ranks(); ++i)
    EXPECT_EQ(cl.process(i).exit.ToString(), "exit 0") << cl.process(i).name;
  o.decode_pp = 0;
  EXPECT_EQ(Cluster::Start(o).status().code(), StatusCode::kInvalidArgument);
}

// A port held by something else: bound (without SO_REUSEADDR, not
// listening), so a server's bind there fails with EADDRINUSE at once.
class HeldPort {
 public:
  HeldPort() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      port_ = ntohs(addr.sin_port);
  }
  ~HeldPort() {
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = -1;
};

// CI once failed a whole case because another test took prefill tp0's
// picked bootstrap port before tp0 listened on it. Start gives tp0 a fresh
// port then; the try that found its port taken stays in history(0).
TEST(Cluster, PrefillTp0WhosePortIsTakenIsStartedAgainOnAnotherPort) {
  HeldPort held;
  ASSERT_GT(held.port(), 0);
  std::vector<int> picked;
  ClusterOptions o;
  o.binary = Binary();
  o.worker_args = Concat(kSmallLayout, {"--requests", "2"});
  o.pick_port = [&]() -> Result<int> {
    Result<int> port = picked.empty() ? Result<int>(held.port()) : PickFreePort();
    if (port.ok()) picked.push_back(*port);
    return port;
  };
  auto c = Cluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Cluster& cl = **c;
  ASSERT_EQ(picked.size(), 2u);
  EXPECT_EQ(cl.bootstrap_addr(), "127.0.0.1:" + std::to_string(picked[1]));
  ASSERT_EQ(cl.history(0).size(), 1u);
  EXPECT_TRUE(cl.history(0)[0].ready.is_null());
  EXPECT_TRUE(cl.history(0)[0].exit.reaped);
  ASSERT_TRUE(cl.CollectReports(30s).ok());
  for (int i = 0; i < cl.num_ranks(); ++i) {
    ASSERT_TRUE(cl.process(i).report.has_value()) << cl.process(i).name;
    ExpectClean(*cl.process(i).report, 2, "after the port retry");
  }
  cl.Shutdown(20s);
  for (int i = 0; i < cl.num_ranks(); ++i)
    EXPECT_EQ(cl.process(i).exit.ToString(), "exit 0") << cl.process(i).name;
}

// A port that stays taken ends Start after three tries, with tp0's own words.
TEST(Cluster, APortTakenOnEveryTryFailsStartNamingTheAddressInUse) {
  HeldPort held;
  ASSERT_GT(held.port(), 0);
  int picks = 0;
  ClusterOptions o;
  o.binary = Binary();
  o.worker_args = Concat(kSmallLayout, {"--requests", "0"});
  o.pick_port = [&]() -> Result<int> {
    ++picks;
    return held.port();
  };
  auto c = Cluster::Start(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(picks, 3);
  const std::string& m = c.status().message();
  EXPECT_NE(m.find("prefill tp0"), std::string::npos) << m;
  EXPECT_NE(m.find("3 time(s)"), std::string::npos) << m;
  EXPECT_NE(m.find("127.0.0.1:" + std::to_string(held.port()) + ": address already in use"),
            std::string::npos)
      << m;
}

}  // namespace
}  // namespace kvbridge::tools
