// The operator commands, run for real as the `kvbridge` binary: bootstrap
// (standalone server, clean exit on SIGINT/SIGTERM), status against it (table
// and JSON, parsed; --watch; an unreachable server), explain for every
// cause, and bad flags.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "control/auth.h"
#include "control/bootstrap_client.h"
#include "control/record_json.h"
#include "kvbridge/errors.h"
#include "tests/integration/subprocess_util.h"

namespace kvbridge {
namespace {

using internal::BootstrapClient;
using internal::RankRecord;
using internal::RankRole;
using nlohmann::json;
using std::chrono::milliseconds;
using testing::CommandOutput;
using testing::RunCommand;
using testing::Subprocess;

const std::string kCli = std::string(KVB_BIN_DIR) + "/kvbridge";

// Runs `kvbridge ARGS` through the shell, stderr folded into the output
// unless `stderr_too` is false.
CommandOutput Cli(const std::string& args, bool stderr_too = true) {
  return RunCommand(kCli + " " + args + (stderr_too ? " 2>&1" : " 2>/dev/null"));
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A port nothing listens on (bound, then released).
int DeadPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

constexpr char kListening[] = "kvbridge bootstrap server listening on ";

// `kvbridge bootstrap` on a free loopback port; its address.
struct Bootstrap {
  Subprocess proc;
  std::string address;
};

Result<Bootstrap> StartBootstrap() {
  KVB_ASSIGN_OR_RETURN(Subprocess proc, Subprocess::Spawn(kCli, {"bootstrap", "--host", "127.0.0.1",
                                                                 "--port", "0"}));
  KVB_ASSIGN_OR_RETURN(std::string line, proc.ReadLineWithPrefix(kListening, milliseconds(30000)));
  std::string rest = line.substr(sizeof(kListening) - 1);
  return Bootstrap{std::move(proc), rest.substr(0, rest.find(' '))};
}

int ExitCode(Subprocess& p) {
  Result<int> status = p.Wait(milliseconds(30000));
  if (!status.ok()) return -1000;
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : -WTERMSIG(*status);
}

RankRecord Rank(RankRole role, int tp, uint64_t incarnation) {
  RankRecord r;
  r.role = role;
  r.attn_tp_size = 2;
  r.attn_tp_rank = tp;
  r.rank_ip = "127.0.0.1";
  r.rank_port = (role == RankRole::kPrefill ? 18000 : 19000) + tp;
  r.page_size = 16;
  r.kv_cache_dtype = "bfloat16";
  r.host = "node-a";
  r.pid = (role == RankRole::kPrefill ? 4000 : 5000) + tp;
  r.incarnation = incarnation;
  return r;
}

const char kFailureMessage[] =
    "room 7: decode tp0 (host node-a, pid 5000) exited (process exited) during transferring; "
    "detected by prefill tp0 via transport error; look at that rank's log and dmesg (OOM "
    "killer?), then restart its instance.";

TEST(CliBootstrapStatus, TableAndJsonShowRanksLivenessAndFailures) {
  Result<Bootstrap> bs = StartBootstrap();
  ASSERT_TRUE(bs.ok()) << bs.status().ToString();
  auto client =
      BootstrapClient::Create(bs->address, milliseconds(5000), internal::AuthTokenFromEnvironment())
          .value();
  // Prefill tp0 has a client of its own: it reports the failure below.
  auto prefill0 =
      BootstrapClient::Create(bs->address, milliseconds(5000), internal::AuthTokenFromEnvironment())
          .value();
  ASSERT_TRUE(prefill0->RegisterRank(Rank(RankRole::kPrefill, 0, 11)).ok());
  ASSERT_TRUE(client->RegisterRank(Rank(RankRole::kPrefill, 1, 12)).ok());
  ASSERT_TRUE(client->RegisterRank(Rank(RankRole::kDecode, 0, 21)).ok());
  // The registry keeps a record in its canonical form: the message is made
  // from the fields, as a rank's own record would be.
  FailureRecord dead;
  dead.room = 7;
  dead.origin.role = Role::kDecode;
  dead.origin.host = "node-a";
  dead.origin.pid = 5000;
  dead.origin.incarnation = 21;
  dead.cause = FailureCause::kPeerExited;
  dead.detail = "process exited";
  dead.phase = Phase::kTransferring;
  dead.detected_by.role = Role::kPrefill;
  dead.detected_by.incarnation = 11;
  dead.mechanism = "transport error";
  dead.hint = std::string(FailureHint(FailureCause::kPeerExited));
  ASSERT_EQ(dead.Message(), kFailureMessage);
  ASSERT_TRUE(prefill0->PublishFailure(internal::FailureRecordToJson(dead)).ok());

  CommandOutput table = Cli("status --bootstrap " + bs->address);
  ASSERT_EQ(table.exit_status, 0) << table.out;
  EXPECT_TRUE(Contains(table.out, "bootstrap server " + bs->address +
                                      ": 3 ranks (2 alive, 0 unresponsive, 1 dead), 1 failure "
                                      "records"))
      << table.out;
  for (const char* column : {"ROLE", "DP", "TP", "PP", "HOST", "PID", "ADDRESS", "HEARTBEAT",
                             "STATE", "127.0.0.1:18001", "127.0.0.1:19000", "4001", "node-a"}) {
    EXPECT_TRUE(Contains(table.out, column)) << column << " missing:\n" << table.out;
  }
  EXPECT_TRUE(Contains(table.out, std::string("#1 ") + kFailureMessage)) << table.out;

  CommandOutput js = Cli("status --json --bootstrap " + bs->address, /*stderr_too=*/false);
  ASSERT_EQ(js.exit_status, 0) << js.out;
  json j = json::parse(js.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "not one JSON object:\n" << js.out;
  EXPECT_EQ(j["bootstrap"], bs->address);
  ASSERT_EQ(j["ranks"].size(), 3u) << j.dump(2);
  for (const json& r : j["ranks"]) {
    for (const char* field : {"role", "dp", "tp", "pp", "cp", "host", "pid", "address",
                              "incarnation", "heartbeat_age_ms", "state", "restarts"}) {
      EXPECT_TRUE(r.contains(field)) << field << " missing in " << r.dump();
    }
    const bool decode = r["role"] == "decode";
    EXPECT_EQ(r["state"], decode ? "dead" : "alive") << r.dump();
    EXPECT_GE(r["heartbeat_age_ms"].get<int64_t>(), 0);
  }
  EXPECT_EQ(j["ranks"][1]["tp"], 1);
  EXPECT_EQ(j["ranks"][1]["pid"], 4001);
  EXPECT_EQ(j["ranks"][1]["address"], "127.0.0.1:18001");
  EXPECT_EQ(j["counts"], (json{{"alive", 2}, {"unresponsive", 0}, {"dead", 1}}));
  ASSERT_EQ(j["failures"].size(), 1u);
  EXPECT_EQ(j["failures"][0]["seq"], 1);
  EXPECT_EQ(j["failures"][0]["cause"], "peer_exited");
  EXPECT_EQ(j["failures"][0]["message"], kFailureMessage);
  EXPECT_EQ(j["failures_total"], 1);

  // --watch --json: one object per refresh until SIGTERM, then exit 0.
  Result<Subprocess> watch = Subprocess::Spawn(
      kCli, {"status", "--bootstrap", bs->address, "--watch", "--interval", "0.1", "--json"});
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  for (int i = 0; i < 2; ++i) {
    Result<std::string> line = watch->ReadLine(milliseconds(30000));
    ASSERT_TRUE(line.ok()) << line.status().ToString();
    json frame = json::parse(*line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(frame.is_discarded()) << *line;
    EXPECT_EQ(frame["ranks"].size(), 3u);
  }
  ASSERT_TRUE(watch->Kill(SIGTERM).ok());
  EXPECT_EQ(ExitCode(*watch), 0);

  ASSERT_TRUE(bs->proc.Kill(SIGTERM).ok());
  Result<std::string> bye = bs->proc.ReadLineWithPrefix("kvbridge bootstrap:", milliseconds(30000));
  ASSERT_TRUE(bye.ok()) << bye.status().ToString();
  EXPECT_TRUE(Contains(*bye, "SIGTERM received, stopping")) << *bye;
  EXPECT_EQ(ExitCode(bs->proc), 0);
}

TEST(CliBootstrapStatus, BootstrapServesMetrics) {
  Result<Bootstrap> bs = StartBootstrap();
  ASSERT_TRUE(bs.ok()) << bs.status().ToString();
  auto client =
      BootstrapClient::Create(bs->address, milliseconds(5000), internal::AuthTokenFromEnvironment())
          .value();
  ASSERT_TRUE(client->RegisterRank(Rank(RankRole::kPrefill, 0, 11)).ok());
  // The table's own queries are counted: GET /ranks answered 200.
  ASSERT_EQ(Cli("status --bootstrap " + bs->address).exit_status, 0);
  const std::string host = bs->address.substr(0, bs->address.rfind(':'));
  const int port = std::stoi(bs->address.substr(bs->address.rfind(':') + 1));
  httplib::Client http(host, port);
  httplib::Result res = http.Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const std::string& body = res->body;
  EXPECT_TRUE(Contains(body, "# TYPE kvbridge_bootstrap_ranks gauge")) << body;
  EXPECT_TRUE(Contains(body, "kvbridge_bootstrap_ranks{role=\"prefill\",state=\"alive\"} 1"))
      << body;
  EXPECT_TRUE(Contains(body,
                       "kvbridge_bootstrap_requests_total{code=\"200\",method=\"GET\","
                       "route=\"/ranks\"} 1"))
      << body;
}

TEST(CliBootstrapStatus, BootstrapStopsCleanlyOnSigint) {
  Result<Bootstrap> bs = StartBootstrap();
  ASSERT_TRUE(bs.ok()) << bs.status().ToString();
  ASSERT_TRUE(bs->proc.Kill(SIGINT).ok());
  EXPECT_EQ(ExitCode(bs->proc), 0);
  // The port is free again at once.
  const std::string port = bs->address.substr(bs->address.rfind(':') + 1);
  Result<Subprocess> again =
      Subprocess::Spawn(kCli, {"bootstrap", "--host", "127.0.0.1", "--port", port});
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->ReadLineWithPrefix(kListening, milliseconds(30000)).ok());
  ASSERT_TRUE(again->Kill(SIGTERM).ok());
  EXPECT_EQ(ExitCode(*again), 0);
}

TEST(CliBootstrapStatus, BootstrapOnATakenPortFails) {
  Result<Bootstrap> bs = StartBootstrap();
  ASSERT_TRUE(bs.ok()) << bs.status().ToString();
  const std::string port = bs->address.substr(bs->address.rfind(':') + 1);
  CommandOutput r = Cli("bootstrap --host 127.0.0.1 --port " + port);
  EXPECT_EQ(r.exit_status, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "address already in use")) << r.out;
}

TEST(CliBootstrapStatus, StatusAgainstADeadPortFailsClearly) {
  const std::string address = "127.0.0.1:" + std::to_string(DeadPort());
  CommandOutput r = Cli("status --bootstrap " + address);
  EXPECT_EQ(r.exit_status, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "bootstrap server " + address + " unreachable: ")) << r.out;
  CommandOutput js = Cli("status --json --bootstrap " + address);
  EXPECT_EQ(js.exit_status, 1) << js.out;
}

// The server `status` reads is a stranger: records whose fields have other
// types than a rank's (a numeric cause aborted the command: terminate,
// exit 134) are shown as they came, and the command exits 0.
TEST(CliBootstrapStatus, RecordsOfOtherShapesAreShownNotFatal) {
  httplib::Server fake;
  fake.Get("/ranks", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"ranks":[]})", "application/json");
  });
  fake.Get("/failures", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"records":[{"cause":5,"seq":1},{"message":9,"cause":["x"]}],)"
                    R"("latest_seq":2,"truncated":false})",
                    "application/json");
  });
  const int port = fake.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&] { fake.listen_after_bind(); });  // the socket listens already
  const std::string address = "127.0.0.1:" + std::to_string(port);
  CommandOutput table = Cli("status --bootstrap " + address);
  CommandOutput js = Cli("status --json --bootstrap " + address, /*stderr_too=*/false);
  fake.stop();
  serving.join();
  EXPECT_EQ(table.exit_status, 0) << table.out;
  EXPECT_TRUE(Contains(table.out, "unknown cause (no message)")) << table.out;
  ASSERT_EQ(js.exit_status, 0) << js.out;
  const json parsed = json::parse(js.out, nullptr, false);
  ASSERT_TRUE(parsed.is_object()) << js.out;
  ASSERT_EQ(parsed["failures"].size(), 2u) << js.out;
  EXPECT_EQ(parsed["failures"][0]["cause"], "unknown") << js.out;
  EXPECT_EQ(parsed["failures"][0]["record"]["cause"], 5) << js.out;
}

// A user who set no secret (issue 12: "with no token configured the user
// gets one clear instruction"): the server and the status table refuse to
// run, exit with their error status and print one line that says what to
// set, before anything listens or connects.
TEST(CliNoToken, BootstrapAndStatusPrintOneInstructionAndExit) {
  const std::string no_token =
      "env -u KVBRIDGE_AUTH_TOKEN -u SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN ";
  // Each command's exit status for a deployment error (status: 2, as for a
  // bad --bootstrap).
  const std::pair<std::string, int> commands[] = {
      {"bootstrap --host 127.0.0.1 --port 0", 1},
      {"status --bootstrap 127.0.0.1:" + std::to_string(DeadPort()), 2}};
  for (const auto& [args, exit_status] : commands) {
    CommandOutput r = RunCommand(no_token + kCli + " " + args + " 2>&1");
    EXPECT_EQ(r.exit_status, exit_status) << args << ":\n" << r.out;
    const std::string command = "kvbridge " + args.substr(0, args.find(' ')) + ": ";
    EXPECT_EQ(r.out.rfind(command, 0), 0u) << r.out;
    EXPECT_FALSE(Contains(r.out.substr(command.size()), command)) << "said twice: " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << ":\n" << r.out;
    for (const char* part : {"no auth token", "set KVBRIDGE_AUTH_TOKEN",
                             "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", "--auth-token-file"}) {
      EXPECT_TRUE(Contains(r.out, part)) << args << ": '" << part << "' missing:\n" << r.out;
    }
    EXPECT_FALSE(Contains(r.out, "listening")) << r.out;
  }
}

TEST(CliExplain, ListsEveryCauseWithItsMeaning) {
  CommandOutput r = Cli("explain");
  ASSERT_EQ(r.exit_status, 0) << r.out;
  for (FailureCause cause : AllFailureCauses()) {
    const std::string name(FailureCauseName(cause));
    size_t at = r.out.find(name + " ");
    ASSERT_NE(at, std::string::npos) << name << " not listed:\n" << r.out;
    std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_GT(line.size(), name.size() + 20) << "no meaning for " << name << ": " << line;
  }
}

TEST(CliExplain, PrintsTheEntryOfEveryCause) {
  for (FailureCause cause : AllFailureCauses()) {
    const std::string name(FailureCauseName(cause));
    CommandOutput r = Cli("explain " + name);
    ASSERT_EQ(r.exit_status, 0) << name << "\n" << r.out;
    EXPECT_TRUE(Contains(r.out, "## `" + name + "`")) << r.out;
    for (const char* section : {"### Trigger scenarios", "### Common situations", "### What to do",
                                "### Example", "room 42: "}) {
      EXPECT_TRUE(Contains(r.out, section)) << name << " lacks " << section;
    }
    EXPECT_TRUE(Contains(r.out, std::string(StatusCodeName(FailureCauseCode(cause)))));
  }
  // Spelled the way a log line or a shell user might.
  CommandOutput upper = Cli("explain PEER-EXITED");
  EXPECT_EQ(upper.exit_status, 0);
  EXPECT_TRUE(Contains(upper.out, "## `peer_exited`"));
}

TEST(CliExplain, UnknownCauseListsTheValidOnes) {
  CommandOutput r = Cli("explain no_such_cause");
  EXPECT_EQ(r.exit_status, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "unknown cause 'no_such_cause'")) << r.out;
  for (FailureCause cause : AllFailureCauses()) {
    EXPECT_TRUE(Contains(r.out, std::string(FailureCauseName(cause)))) << r.out;
  }
}

TEST(CliFlags, BadFlagsAreUsageErrors) {
  struct Case {
    const char* args;
    const char* says;
  };
  const Case cases[] = {
      {"status", "--bootstrap is required"},
      {"status --bootstrap 127.0.0.1:1 --interval 1", "--interval requires --watch"},
      {"status --bootstrap 127.0.0.1:1 --no-such-flag", "--no-such-flag"},
      {"bootstrap --port 70000", "--port"},
      {"bootstrap --port abc", "--port"},
      {"explain a b", "b"},
      {"worker --role prefill --pp-size 2 --pp-rank 2", "--pp-rank: 2 is not below --pp-size 2"},
      {"worker --role decode --pp-rank 1", "--pp-rank: 1 is not below --pp-size 1"},
      {"worker --role prefill --layers 2 --pp-size 3", "--pp-size: 3 stages for 2 layers"},
      {"worker --role prefill --advertise-host ''", "--advertise-host '' is empty"},
      {"worker --role prefill --advertise-host 'a b'", "--advertise-host 'a b' holds a character"},
      {"worker --role prefill --advertise-host 10.0.0.1:8998", "is not an IP address"},
      {"worker --role prefill --advertise-host '[::1]'", "IPv6 without brackets"},
  };
  for (const Case& c : cases) {
    CommandOutput r = Cli(c.args);
    EXPECT_NE(r.exit_status, 0) << c.args << "\n" << r.out;
    EXPECT_NE(r.exit_status, -1) << c.args << " crashed\n" << r.out;
    EXPECT_TRUE(Contains(r.out, c.says)) << c.args << "\n" << r.out;
    EXPECT_TRUE(Contains(r.out, "--help")) << c.args << ": no pointer to the usage\n" << r.out;
  }
  CommandOutput bad_address = Cli("status --bootstrap no-port-here");
  EXPECT_EQ(bad_address.exit_status, 2) << bad_address.out;
  EXPECT_TRUE(Contains(bad_address.out, "no-port-here")) << bad_address.out;
}

}  // namespace
}  // namespace kvbridge
