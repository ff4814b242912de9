// EtcdRegistryClient against a real etcd (one member, started here on free
// loopback ports; skipped when /usr/bin/etcd is missing). Each test uses a
// namespace of its own in the suite's etcd.
#include "control/etcd_registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <set>
#include <thread>

#include "connector/stall_proxy.h"
#include "control/etcd_seal.h"
#include "control/etcd_view.h"
#include "control/json_fields.h"
#include "control/record_json.h"
#include "tools/etcd_cluster.h"

namespace kvbridge::internal {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

const char kSecret[] = "etcd registry test secret";

class EtcdRegistryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!tools::EtcdCluster::Available()) return;
    auto c = tools::EtcdCluster::Start({});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    etcd_ = std::move(c).value().release();
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }
  void SetUp() override {
    if (!tools::EtcdCluster::Available()) GTEST_SKIP() << "/usr/bin/etcd missing (etcd-server)";
    ASSERT_NE(etcd_, nullptr);
    ns_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  std::unique_ptr<EtcdRegistryClient> Client(size_t max_records = 1024) {
    auto o = ParseEtcdRegistryUrl(etcd_->Url(ns_));
    EXPECT_TRUE(o.ok()) << o.status().ToString();
    o->unresponsive_after = milliseconds(1000);
    o->dead_after = milliseconds(2000);
    o->max_failure_records = max_records;
    o->auth_token = kSecret;
    auto c = EtcdRegistryClient::Create(*o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // Puts raw bytes at a key of this test's namespace.
  void RawPut(const std::string& rest, const std::string& value) {
    EtcdGatewayOptions go;
    go.endpoints = ParseEtcdEndpoints(etcd_->Endpoints()).value();
    auto gw = EtcdGateway::Create(go).value();
    auto r = gw->Call("/v3/kv/put", json{{"key", EtcdGateway::B64("/kvbridge/" + ns_ + "/" + rest)},
                                         {"value", EtcdGateway::B64(value)}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  // Puts `value` at a key of this test's namespace sealed with `secret`, as
  // a rank of the deployment (kSecret) or of another one would.
  void SealedPut(const std::string& rest, const json& value, const char* secret = kSecret) {
    RawPut(rest, EtcdSeal(secret).Seal("/kvbridge/" + ns_ + "/" + rest, value));
  }

  // Waits, on the client's watch, until `done` holds; false at the deadline.
  static bool WaitFor(const EtcdRegistryClient& c, const std::function<bool()>& done,
                      milliseconds timeout = milliseconds(10000)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const uint64_t seen = c.changes();
      if (done()) return true;
      const auto left =
          std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      c.AwaitChange(seen, left);
    }
  }

  static RankRecord Prefill(int tp, int tp_size, uint64_t incarnation) {
    RankRecord r;
    r.role = RankRole::kPrefill;
    r.attn_tp_size = tp_size;
    r.attn_tp_rank = tp;
    r.rank_ip = "127.0.0.1";
    r.page_size = 16;
    r.kv_cache_dtype = "bfloat16";
    r.host = "host-" + std::to_string(tp);
    r.pid = 1000 + tp;
    r.incarnation = incarnation;
    return r;
  }

  static json RankFailure(const RankRecord& r) {
    FailureRecord f;
    f.origin.role = Role::kPrefill;
    f.origin.tp = r.attn_tp_rank;
    f.origin.incarnation = r.incarnation;
    f.origin.host = r.host;
    f.cause = FailureCause::kPeerExited;
    f.detail = "test";
    return FailureRecordToJson(f);
  }

  static RankStatus Find(const std::vector<RankStatus>& ranks, RankRole role, int tp) {
    for (const RankStatus& s : ranks)
      if (s.record.role == role && s.record.attn_tp_rank == tp) return s;
    ADD_FAILURE() << "rank tp" << tp << " not listed";
    return {};
  }

  static tools::EtcdCluster* etcd_;
  std::string ns_;
};

tools::EtcdCluster* EtcdRegistryTest::etcd_ = nullptr;

TEST_F(EtcdRegistryTest, DecodeFindsEveryPrefillRankOnceAllRegistered) {
  auto a = Client(), b = Client(), decode = Client();
  ASSERT_TRUE(a && b && decode);
  ASSERT_TRUE(a->RegisterRank(Prefill(0, 2, 11)).ok());
  ASSERT_TRUE(WaitFor(*decode, [&] { return decode->ListRanks()->size() == 1; }));
  Result<ParallelInfo> partial = decode->GetParallelInfo();
  EXPECT_EQ(partial.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(partial.status().message().find("1 of 2"), std::string::npos);
  EXPECT_EQ(decode->GetRank(0, 0, 0, 0).status().code(), StatusCode::kUnavailable);

  ASSERT_TRUE(b->RegisterRank(Prefill(1, 2, 22)).ok());
  ASSERT_TRUE(WaitFor(*decode, [&] { return decode->GetParallelInfo().ok(); }));
  ParallelInfo info = decode->GetParallelInfo().value();
  EXPECT_EQ(info.attn_tp_size, 2);
  EXPECT_EQ(info.ranks_registered, 2);
  Result<RankRecord> tp1 = decode->GetRank(0, 0, 1, 0);
  ASSERT_TRUE(tp1.ok()) << tp1.status().ToString();
  EXPECT_EQ(tp1->incarnation, 22u);
  EXPECT_EQ(tp1->host, "host-1");
  EXPECT_EQ(decode->GetRank(0, 0, 2, 0).status().code(), StatusCode::kNotFound);
  const std::vector<RankStatus> ranks = decode->ListRanks().value();
  for (const RankStatus& s : ranks) EXPECT_EQ(s.state, Liveness::kAlive);
  // A layout other than the live ranks' is refused.
  EXPECT_EQ(decode->RegisterRank(Prefill(0, 4, 33)).code(), StatusCode::kFailedPrecondition);
}

// A reader of the watched copy can take a rank that has just restarted for
// its old incarnation: the watch lags the store by milliseconds. CatchUp
// waits until the copy holds what the store held when called; a decode rank
// calls it before it fails a request on a dead prefill rank's record.
TEST_F(EtcdRegistryTest, CatchUpShowsARestartTheStoreAlreadyHolds) {
  auto a = Client(), decode = Client();
  ASSERT_TRUE(a && decode);
  ASSERT_TRUE(a->RegisterRank(Prefill(0, 1, 11)).ok());
  ASSERT_TRUE(decode->CatchUp().ok());
  ASSERT_EQ(decode->GetRank(0, 0, 0, 0).value().incarnation, 11u);
  for (uint64_t restart = 100; restart < 120; ++restart) {
    ASSERT_TRUE(a->RegisterRank(Prefill(0, 1, restart)).ok());
    Status caught = decode->CatchUp();
    ASSERT_TRUE(caught.ok()) << caught.ToString();
    Result<RankRecord> now = decode->GetRank(0, 0, 0, 0);
    ASSERT_TRUE(now.ok()) << now.status().ToString();
    ASSERT_EQ(now->incarnation, restart);
  }
}

// Another deployment writing to the same etcd moves the store's revision,
// and this namespace's watch never sees those writes. CatchUp waited for
// the store's revision: 2 s and Unavailable on every call, with decode's
// lookups serialised behind it (review finding, session 36). It waits for
// the newest write under its own namespace.
TEST_F(EtcdRegistryTest, CatchUpIsNotHeldByWritesOfAnotherNamespace) {
  // Leases long enough that none expires in the test: an expiry is a write
  // under the namespace, which the old wait would have reached.
  auto o = ParseEtcdRegistryUrl(etcd_->Url(ns_));
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  o->unresponsive_after = milliseconds(60000);
  o->dead_after = milliseconds(120000);
  o->auth_token = kSecret;
  auto made = EtcdRegistryClient::Create(*o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  std::unique_ptr<EtcdRegistryClient> a = std::move(made).value();
  ASSERT_TRUE(a->RegisterRank(Prefill(0, 1, 11)).ok());
  ASSERT_TRUE(a->CatchUp().ok());
  EtcdGatewayOptions go;
  go.endpoints = ParseEtcdEndpoints(etcd_->Endpoints()).value();
  auto gw = EtcdGateway::Create(go).value();
  for (int i = 0; i < 3; ++i) {
    auto put =
        gw->Call("/v3/kv/put",
                 json{{"key", EtcdGateway::B64("/kvbridge/" + ns_ + "-other/" + std::to_string(i))},
                      {"value", EtcdGateway::B64("x")}});
    ASSERT_TRUE(put.ok()) << put.status().ToString();
  }
  Status caught = a->CatchUp();
  EXPECT_TRUE(caught.ok()) << caught.ToString();
  EXPECT_EQ(a->GetRank(0, 0, 0, 0).value().incarnation, 11u);
}

TEST_F(EtcdRegistryTest, SilentRankTurnsUnresponsiveThenDeadByLease) {
  auto watcher = Client();
  ASSERT_TRUE(watcher);
  RankRecord rec = Prefill(0, 1, 7);
  {
    auto rank = Client();
    ASSERT_TRUE(rank->RegisterRank(rec).ok());
    ASSERT_TRUE(WaitFor(*watcher, [&] { return watcher->ListRanks()->size() == 1; }));
    // Gone without a word (as a SIGKILLed process): its leases must run out.
    rank->AbandonLeases();
  }
  auto state = [&] { return Find(watcher->ListRanks().value(), RankRole::kPrefill, 0).state; };
  ASSERT_TRUE(WaitFor(*watcher, [&] { return state() == Liveness::kUnresponsive; }));
  RankStatus unresponsive = Find(watcher->ListRanks().value(), RankRole::kPrefill, 0);
  EXPECT_GE(unresponsive.age.count(), 1000);
  ASSERT_TRUE(WaitFor(*watcher, [&] { return state() == Liveness::kDead; }));
  RankStatus dead = Find(watcher->ListRanks().value(), RankRole::kPrefill, 0);
  EXPECT_GE(dead.age.count(), 2000);
  EXPECT_EQ(dead.record.incarnation, 7u);
  EXPECT_EQ(dead.dead_by_seq, 0u);  // the lease said so, not a record
}

TEST_F(EtcdRegistryTest, HeartbeatsKeepARankAliveAndAreFencedByARecord) {
  auto rank = Client(), watcher = Client();
  ASSERT_TRUE(rank && watcher);
  RankRecord rec = Prefill(0, 1, 9);
  EXPECT_EQ(rank->Heartbeat(RankRole::kPrefill, 0, 0, 0, 0, 9).code(), StatusCode::kNotFound);
  ASSERT_TRUE(rank->RegisterRank(rec).ok());
  // Four alive-lease TTLs of heartbeats (a bounded load loop).
  const auto end = std::chrono::steady_clock::now() + milliseconds(4000);
  while (std::chrono::steady_clock::now() < end) {
    ASSERT_TRUE(rank->Heartbeat(RankRole::kPrefill, 0, 0, 0, 0, 9).ok());
    std::this_thread::sleep_for(milliseconds(100));  // the heartbeat interval
  }
  EXPECT_EQ(rank->Heartbeat(RankRole::kPrefill, 0, 0, 0, 0, 8).code(), StatusCode::kNotFound);
  // Barrier: a record the watcher sees was written after the loop, so its
  // picture is at least that recent.
  Result<uint64_t> seq = rank->PublishFailure(RankFailure(Prefill(5, 8, 1)));
  ASSERT_TRUE(seq.ok()) << seq.status().ToString();
  ASSERT_TRUE(WaitFor(*watcher, [&] { return watcher->FailuresSince(0)->latest_seq >= *seq; }));
  EXPECT_EQ(Find(watcher->ListRanks().value(), RankRole::kPrefill, 0).state, Liveness::kAlive);

  Result<uint64_t> fence = watcher->PublishFailure(RankFailure(rec));
  ASSERT_TRUE(fence.ok());
  ASSERT_TRUE(WaitFor(*rank, [&] { return rank->FailuresSince(0)->latest_seq >= *fence; }));
  Status beat = rank->Heartbeat(RankRole::kPrefill, 0, 0, 0, 0, 9);
  EXPECT_EQ(beat.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(beat.message().find("failure record " + std::to_string(*fence)), std::string::npos);
  EXPECT_EQ(rank->RegisterRank(rec).code(), StatusCode::kFailedPrecondition);
  RankStatus s = Find(watcher->ListRanks().value(), RankRole::kPrefill, 0);
  EXPECT_EQ(s.state, Liveness::kDead);
  EXPECT_EQ(s.dead_by_seq, *fence);
  // A new incarnation at the position is a restart, alive again.
  RankRecord next = rec;
  next.incarnation = 10;
  ASSERT_TRUE(rank->RegisterRank(next).ok());
  ASSERT_TRUE(WaitFor(*watcher, [&] {
    return Find(watcher->ListRanks().value(), RankRole::kPrefill, 0).record.incarnation == 10;
  }));
  s = Find(watcher->ListRanks().value(), RankRole::kPrefill, 0);
  EXPECT_EQ(s.state, Liveness::kAlive);
  EXPECT_EQ(s.restarts, 1u);
}

// A member that goes silent (stopped, black-holed: it accepts connections
// and never answers), listed first. Each keep-alive tried it for the whole
// call timeout (2 s) before the next member: longer than the 2 s alive
// lease, which expired, and the rank's siblings failed a healthy rank
// (review finding, session 36). The proxy in front of the one member is the
// silent one; the alive key's create_revision says whether it ever expired
// (an expired lease deletes the key, and the next keep-alive makes a new one).
TEST_F(EtcdRegistryTest, ASilentMemberListedFirstDoesNotLetTheAliveLeaseExpire) {
  StallProxy silent(etcd_->endpoint(0));
  ASSERT_TRUE(silent.ok());
  auto o =
      ParseEtcdRegistryUrl("etcd://" + silent.address() + "," + etcd_->endpoint(0) + "/" + ns_);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  o->unresponsive_after = milliseconds(2000);
  o->dead_after = milliseconds(20000);
  o->auth_token = kSecret;
  auto made = EtcdRegistryClient::Create(*o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  std::unique_ptr<EtcdRegistryClient> rank = std::move(made).value();
  ASSERT_TRUE(rank->RegisterRank(Prefill(0, 1, 9)).ok());
  EtcdGatewayOptions go;
  go.endpoints = ParseEtcdEndpoints(etcd_->Endpoints()).value();
  auto gw = EtcdGateway::Create(go).value();
  const std::string alive =
      "/kvbridge/" + ns_ + "/alive/" + EtcdRankPath(RankRole::kPrefill, RankKey{0, 0, 0, 0}, 9);
  auto created = [&]() -> int64_t {
    EtcdKv kv;
    bool found = false;
    EXPECT_TRUE(gw->Get(alive, &kv, &found).ok());
    return found ? kv.create_revision : 0;
  };
  const int64_t before = created();
  ASSERT_NE(before, 0) << "no alive key at " << alive;
  silent.Stall();
  // Three alive-lease TTLs of heartbeats (a bounded load loop).
  const auto end = std::chrono::steady_clock::now() + milliseconds(6000);
  while (std::chrono::steady_clock::now() < end) {
    Status beat = rank->Heartbeat(RankRole::kPrefill, 0, 0, 0, 0, 9);
    ASSERT_TRUE(beat.ok()) << beat.ToString();
    std::this_thread::sleep_for(milliseconds(100));  // the heartbeat interval
  }
  EXPECT_EQ(created(), before) << "the alive lease expired while a member was silent";
  silent.ResumeDroppingHeld();
}

TEST_F(EtcdRegistryTest, ConcurrentPublishersGetDenseUniqueSeqsSeenByWatch) {
  auto a = Client(), b = Client(), watcher = Client();
  ASSERT_TRUE(a && b && watcher);
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  watcher->SetChangeCallback([&] {
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    cv.notify_all();
  });
  constexpr int kEach = 10;
  std::vector<uint64_t> seqs[2];
  auto publish = [&](EtcdRegistryClient* c, int who) {
    for (int i = 0; i < kEach; ++i) {
      Result<uint64_t> s = c->PublishFailure(RankFailure(Prefill(who, 2, 100 + i)));
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      seqs[who].push_back(*s);
    }
  };
  std::thread ta(publish, a.get(), 0), tb(publish, b.get(), 1);
  ta.join();
  tb.join();
  std::set<uint64_t> all(seqs[0].begin(), seqs[0].end());
  all.insert(seqs[1].begin(), seqs[1].end());
  ASSERT_EQ(all.size(), 2u * kEach) << "a seq was handed out twice";
  EXPECT_EQ(*all.begin(), 1u);
  EXPECT_EQ(*all.rbegin(), 2u * kEach);
  ASSERT_TRUE(WaitFor(*watcher, [&] { return watcher->FailuresSince(0)->records.size() == 20; }));
  FailureBatch batch = watcher->FailuresSince(0).value();
  for (size_t i = 0; i < batch.records.size(); ++i)
    EXPECT_EQ(batch.records[i]["seq"].get<uint64_t>(), i + 1);
  EXPECT_EQ(watcher->FailuresSince(15)->records.size(), 5u);
  std::unique_lock<std::mutex> lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, milliseconds(5000), [&] { return calls > 0; }));
  lock.unlock();
  watcher->SetChangeCallback(nullptr);
  // Not a FailureRecord: refused before it reaches etcd.
  EXPECT_EQ(a->PublishFailure(json{{"cause", "peer_exited"}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(EtcdRegistryTest, OldestRecordsAreTrimmedAndReportedTruncated) {
  auto c = Client(/*max_records=*/3);
  ASSERT_TRUE(c);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c->PublishFailure(RankFailure(Prefill(0, 1, 1))).ok());
  ASSERT_TRUE(WaitFor(*c, [&] { return c->FailuresSince(0)->records.size() == 3; }));
  FailureBatch batch = c->FailuresSince(0).value();
  EXPECT_TRUE(batch.truncated);
  EXPECT_EQ(batch.latest_seq, 5u);
  EXPECT_EQ(batch.records.front()["seq"].get<uint64_t>(), 3u);
  EXPECT_FALSE(c->FailuresSince(2)->truncated);
}

TEST_F(EtcdRegistryTest, HostileValuesInEtcdAreClearErrorsNeverUsed) {
  auto before = Client();  // sees them by watch
  ASSERT_TRUE(before);
  RankRecord wrong = Prefill(1, 2, 5);
  const json good = {{"schema", kEtcdSchemaVersion},
                     {"record", wrong.ToJson()},
                     {"unresponsive_ttl_ms", 1000},
                     {"dead_ttl_ms", 2000}};
  RawPut("ranks/prefill/dp0/cp0/tp0/pp0", "{not json");
  RawPut("ranks/prefill/dp0/cp0/tp1/pp0", "{\"schema\":7,\"record\":{}}");
  SealedPut("ranks/prefill/dp0/cp0/tp2/pp0", good);  // tp1's record at tp2's key
  SealedPut("ranks/decode/dpX/cp0/tp0/pp0/1", good);
  SealedPut("failures/00000000000000000001",
            {{"schema", kEtcdSchemaVersion}, {"seq", 1}, {"record", {{"cause", 3}}}});
  RawPut("failures/00000000000000000002", std::string((1 << 20) + 100, '['));
  RawPut("alive/prefill/dp0/cp0/tp0/pp0", "[]");
  RawPut("failure_seq", "twelve");
  // Well-formed values without this deployment's seal.
  RawPut("ranks/prefill/dp0/cp0/tp3/pp0", DumpJson(good));
  SealedPut("failures/00000000000000000003",
            {{"schema", kEtcdSchemaVersion}, {"seq", 3}, {"record", RankFailure(wrong)}},
            "another deployment's secret");
  auto after = Client();  // reads them at start
  ASSERT_TRUE(after);
  ASSERT_TRUE(WaitFor(*before, [&] { return before->Problems().size() == 9; }))
      << before->Problems().size();
  for (EtcdRegistryClient* c : {before.get(), after.get()}) {
    std::map<std::string, std::string> problems = c->Problems();
    EXPECT_EQ(problems.size(), 9u);
    const std::string p = c->prefix();
    EXPECT_NE(problems[p + "ranks/prefill/dp0/cp0/tp1/pp0"].find("schema version 7"),
              std::string::npos);
    EXPECT_NE(problems[p + "ranks/prefill/dp0/cp0/tp2/pp0"].find("not of the position"),
              std::string::npos);
    EXPECT_NE(problems[p + "failures/00000000000000000001"].find("origin"), std::string::npos);
    EXPECT_NE(problems[p + "ranks/prefill/dp0/cp0/tp3/pp0"].find("carries no tag"),
              std::string::npos);
    EXPECT_NE(problems[p + "failures/00000000000000000003"].find("not this deployment's"),
              std::string::npos);
    Status bad = c->GetRank(0, 0, 0, 0).status();
    EXPECT_EQ(bad.code(), StatusCode::kInternal);
    EXPECT_NE(bad.message().find("ranks/prefill/dp0/cp0/tp0/pp0"), std::string::npos);
    EXPECT_TRUE(c->ListRanks()->empty());
    EXPECT_TRUE(c->FailuresSince(0)->records.empty());
  }
  Result<uint64_t> seq = after->PublishFailure(RankFailure(wrong));
  EXPECT_EQ(seq.status().code(), StatusCode::kInternal);
  EXPECT_NE(seq.status().message().find("failure_seq"), std::string::npos);
}

// Issue 12: etcd checks only that a writer holds a role on the namespace, so
// an etcd user without the deployment's secret writes well-formed values: a
// failure record naming a live rank, a registration of prefill rank 0 at its
// own address, a failure record copied from another key. None is used: the
// rank stays alive and is found at its own address, and only the genuine
// record is read.
TEST_F(EtcdRegistryTest, ValuesWrittenWithoutTheSecretFenceNobodyAndRegisterNobody) {
  auto rank = Client(), watcher = Client();
  ASSERT_TRUE(rank && watcher);
  RankRecord victim = Prefill(0, 2, 21), sibling = Prefill(1, 2, 22);
  ASSERT_TRUE(rank->RegisterRank(victim).ok());
  ASSERT_TRUE(watcher->RegisterRank(sibling).ok());
  const json fence = {{"schema", kEtcdSchemaVersion}, {"seq", 7}, {"record", RankFailure(victim)}};
  RawPut("failures/00000000000000000007", DumpJson(fence));  // no seal
  SealedPut("failures/00000000000000000008",
            {{"schema", kEtcdSchemaVersion}, {"seq", 8}, {"record", RankFailure(sibling)}},
            "a guess at the secret");
  RankRecord impostor = Prefill(0, 2, 99);
  impostor.rank_ip = "10.9.9.9";
  RawPut("ranks/prefill/dp0/cp0/tp0/pp0", DumpJson(json{{"schema", kEtcdSchemaVersion},
                                                        {"record", impostor.ToJson()},
                                                        {"unresponsive_ttl_ms", 1000},
                                                        {"dead_ttl_ms", 2000}}));
  // A genuine sealed record, copied to the next sequence number.
  Result<uint64_t> genuine = watcher->PublishFailure(RankFailure(Prefill(5, 8, 1)));
  ASSERT_TRUE(genuine.ok()) << genuine.status().ToString();
  ASSERT_TRUE(WaitFor(*watcher, [&] { return watcher->FailuresSince(0)->latest_seq >= *genuine; }));
  EtcdGatewayOptions go;
  go.endpoints = ParseEtcdEndpoints(etcd_->Endpoints()).value();
  auto gw = EtcdGateway::Create(go).value();
  const std::string from = watcher->prefix() + "failures/" + EtcdSeqKey(*genuine);
  EtcdKv stored;
  bool found = false;
  ASSERT_TRUE(gw->Get(from, &stored, &found).ok());
  ASSERT_TRUE(found);
  RawPut("failures/" + EtcdSeqKey(9), stored.value);
  // Barrier: a second genuine record, written after every forged value.
  Result<uint64_t> last = rank->PublishFailure(RankFailure(Prefill(6, 8, 2)));
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  ASSERT_TRUE(WaitFor(*watcher, [&] { return watcher->FailuresSince(0)->latest_seq >= *last; }));

  std::vector<RankStatus> ranks = watcher->ListRanks().value();
  EXPECT_EQ(Find(ranks, RankRole::kPrefill, 1).state, Liveness::kAlive);
  EXPECT_EQ(Find(ranks, RankRole::kPrefill, 1).dead_by_seq, 0u);
  FailureBatch batch = watcher->FailuresSince(0).value();
  std::set<uint64_t> seqs;
  for (const json& r : batch.records) seqs.insert(r["seq"].get<uint64_t>());
  EXPECT_EQ(seqs, (std::set<uint64_t>{*genuine, *last}));
  std::map<std::string, std::string> problems = watcher->Problems();
  const std::string p = watcher->prefix();
  EXPECT_NE(problems[p + "failures/00000000000000000007"].find("carries no tag"),
            std::string::npos);
  EXPECT_NE(problems[p + "failures/00000000000000000008"].find("not this deployment's"),
            std::string::npos);
  EXPECT_NE(problems[p + "failures/" + EtcdSeqKey(9)].find("copied from another key"),
            std::string::npos);
  // The impostor's registration replaced the victim's value in etcd: the
  // position reads as broken (Internal, naming the key), never as the
  // impostor's address.
  Result<RankRecord> at0 = watcher->GetRank(0, 0, 0, 0);
  EXPECT_EQ(at0.status().code(), StatusCode::kInternal);
  EXPECT_NE(problems[p + "ranks/prefill/dp0/cp0/tp0/pp0"].find("carries no tag"),
            std::string::npos);
}

TEST_F(EtcdRegistryTest, MalformedUrlsAreRefusedNamingThePart) {
  struct Case {
    const char* url;
    const char* says;
  };
  for (const Case& c :
       {Case{"http://127.0.0.1:2379", "etcd://"}, Case{"etcd://", "etcd endpoint"},
        Case{"etcd://127.0.0.1", "port"}, Case{"etcd://127.0.0.1:2379,", "etcd endpoint"},
        Case{"etcd://127.0.0.1:99999", "port"}, Case{"etcd://127.0.0.1:2379/", "namespace"},
        Case{"etcd://127.0.0.1:2379/a/b", "namespace"}}) {
    Result<EtcdRegistryOptions> o = ParseEtcdRegistryUrl(c.url);
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument) << c.url;
    EXPECT_NE(o.status().message().find(c.says), std::string::npos) << o.status().message();
  }
  Result<EtcdRegistryOptions> ok = ParseEtcdRegistryUrl("etcd://a:1,[::1]:2/prod-1");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->ns, "prod-1");
  ASSERT_EQ(ok->gateway.endpoints.size(), 2u);
  EXPECT_EQ(ok->gateway.endpoints[1].host, "::1");
  // Nobody listens there: a clear Unavailable, not a hang.
  EtcdRegistryOptions nowhere = ParseEtcdRegistryUrl("etcd://127.0.0.1:1/x").value();
  nowhere.gateway.retry_for = milliseconds(200);
  // Without the deployment's secret nothing could be sealed: refused first.
  Status no_secret = EtcdRegistryClient::Create(nowhere).status();
  EXPECT_EQ(no_secret.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(no_secret.message().find("KVBRIDGE_AUTH_TOKEN"), std::string::npos)
      << no_secret.ToString();
  nowhere.auth_token = kSecret;
  auto none = EtcdRegistryClient::Create(nowhere);
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvbridge::internal
