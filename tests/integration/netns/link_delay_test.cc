// The delaying wire (HostNet::Delay, tools/link_delay.h) measured with
// ping: a host with a 20 ms delay on its link answers pings in >= 40 ms
// (20 ms each way), while a pair of hosts without it, pinged in the same
// run, answers in well under that.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>

#include "tests/integration/netns/hosts_util.h"

namespace kvbridge::tools {
namespace {

struct Rtt {
  double min_ms = -1, avg_ms = -1, max_ms = -1;
  int received = 0;
};

// `ping -c N` from host `from` to host `to`; min/avg/max from its summary.
Rtt Ping(const HostNet& net, int from, int to, int count) {
  Rtt r;
  const std::string cmd = "ip netns exec " + net.netns(from) + " ping -n -q -c " +
                          std::to_string(count) + " -i 0.05 -W 2 " + net.address(to) + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return r;
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), f) != nullptr) out += buf;
  pclose(f);
  std::smatch m;
  static const std::regex kRecv(R"((\d+) received)");
  static const std::regex kRtt(R"(= ([\d.]+)/([\d.]+)/([\d.]+)/)");
  if (std::regex_search(out, m, kRecv)) r.received = std::stoi(m[1]);
  if (std::regex_search(out, m, kRtt)) {
    r.min_ms = std::stod(m[1]);
    r.avg_ms = std::stod(m[2]);
    r.max_ms = std::stod(m[3]);
  }
  return r;
}

TEST(LinkDelayTest, TwentyMsEachWayShowsInPing) {
  KVB_SKIP_WITHOUT_HOSTS();
  if (system("command -v ping >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no ping (Debian iputils-ping)";
  auto created = HostNet::Create(3);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  HostNet& net = **created;
  const std::string kvbridge = std::string(KVB_BIN_DIR) + "/kvbridge";
  ASSERT_TRUE(net.Delay(1, 20, kvbridge).ok());
  EXPECT_EQ(net.Delay(1, 20, kvbridge).code(), StatusCode::kFailedPrecondition);
  constexpr int kCount = 20;
  const Rtt delayed = Ping(net, 2, 1, kCount);
  const Rtt direct = Ping(net, 2, 0, kCount);
  std::printf("PING h2->h1 (20 ms delay on h1's link): min/avg/max %.2f/%.2f/%.2f ms, %d/%d\n",
              delayed.min_ms, delayed.avg_ms, delayed.max_ms, delayed.received, kCount);
  std::printf("PING h2->h0 (no delay, same run): min/avg/max %.2f/%.2f/%.2f ms, %d/%d\n",
              direct.min_ms, direct.avg_ms, direct.max_ms, direct.received, kCount);
  EXPECT_EQ(delayed.received, kCount);
  EXPECT_EQ(direct.received, kCount);
  // 20 ms each way; the wire adds no more than scheduling noise on top.
  EXPECT_GE(delayed.min_ms, 40.0);
  EXPECT_LT(delayed.min_ms, 60.0);
  EXPECT_LT(direct.min_ms, 20.0);
}

TEST(LinkDelayTest, BadDelayIsRefused) {
  KVB_SKIP_WITHOUT_HOSTS();
  auto created = HostNet::Create(1);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  const std::string kvbridge = std::string(KVB_BIN_DIR) + "/kvbridge";
  EXPECT_EQ((*created)->Delay(0, 0, kvbridge).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*created)->Delay(0, 10001, kvbridge).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvbridge::tools
