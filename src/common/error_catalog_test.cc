// docs/errors.md is complete and true: an entry for every cause in code, no
// entry for a cause that does not exist, the sections an operator needs, and
// example messages that are what FailureRecord::Message() prints today.
#include "common/error_catalog.h"

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>

#include "kvbridge/errors.h"

namespace kvbridge::internal {
namespace {

using std::chrono::milliseconds;

RankId Rank(Role role, int tp, const char* host, int pid) {
  RankId r;
  r.role = role;
  r.tp = tp;
  r.host = host;
  r.pid = pid;
  return r;
}

// The record each entry's example shows (docs/errors.md, "### Example").
FailureRecord ExampleRecord(FailureCause cause) {
  const RankId p0 = Rank(Role::kPrefill, 0, "node-a", 31336);
  const RankId p1 = Rank(Role::kPrefill, 1, "node-a", 31337);
  const RankId d0 = Rank(Role::kDecode, 0, "node-b", 4242);
  const RankId d1 = Rank(Role::kDecode, 1, "node-b", 4243);
  FailureRecord r;
  r.room = 42;
  r.generation = 1;
  r.cause = cause;
  r.detected_at = std::chrono::system_clock::time_point(std::chrono::hours(24 * 365 * 56));
  r.last_sign_of_life = r.detected_at - milliseconds(400);
  r.is_from_another_rank = true;
  switch (cause) {
    case FailureCause::kPeerExited:
      r.origin = p1, r.detail = "process exited", r.phase = Phase::kTransferring;
      r.detected_by = d0, r.mechanism = "transport error";
      break;
    case FailureCause::kPeerUnreachable:
      r.origin = d1, r.detail = "Endpoint timeout", r.phase = Phase::kTransferring;
      r.detected_by = p1, r.mechanism = "transport error";
      break;
    case FailureCause::kPeerUnresponsive:
      r.origin = p1, r.detail = "stopped (SIGSTOP or a debugger), silent for 0.52 s";
      r.phase = Phase::kTransferring, r.detected_by = d0, r.mechanism = "heartbeat";
      r.last_sign_of_life = r.detected_at - milliseconds(520);
      break;
    case FailureCause::kDeadlineExceeded:
      r.origin = d0, r.detail = "writes to decode tp0 not completed within 10.0 s";
      r.phase = Phase::kTransferring, r.detected_by = p1, r.mechanism = "transfer deadline";
      r.last_sign_of_life = r.detected_at - milliseconds(100);
      break;
    case FailureCause::kLayoutMismatch:
      r.origin = p0, r.detail = "page_size 16 on prefill, 32 on decode";
      r.phase = Phase::kBootstrapping, r.detected_by = d0, r.mechanism = "handshake";
      r.last_sign_of_life = {};
      break;
    case FailureCause::kInvalidRequest:
      r.origin = d0, r.detail = "page index 70000 out of range [0, 65536)";
      r.phase = Phase::kBootstrapping, r.detected_by = d0, r.mechanism = "argument check";
      r.is_from_another_rank = false;
      break;
    case FailureCause::kAborted:
      r.origin = d0, r.detail = "aborted by the application", r.phase = Phase::kWaitingForInput;
      r.detected_by = d0, r.mechanism = "Abort()";
      r.is_from_another_rank = false;
      break;
    case FailureCause::kLocalError:
      r.origin = p1, r.detail = "CUDA out of memory: tried to allocate 2.00 GiB";
      r.phase = Phase::kTransferring, r.detected_by = p1, r.mechanism = "application report";
      break;
    case FailureCause::kRegistryLost:
      r.origin.role = Role::kBootstrap, r.origin.host = "node-a:8998";
      r.detail = "bootstrap server node-a:8998 unreachable: connection refused or failed";
      r.phase = Phase::kBootstrapping, r.detected_by = d0, r.mechanism = "registry";
      r.last_sign_of_life = {};
      break;
    case FailureCause::kUnauthenticated:
      r.origin = p0;
      r.detail =
          "the record of prefill dp0 cp0 tp0 pp0 (host node-a, pid 31336, incarnation 7) looked "
          "up at node-a:8998 carries no address tag: not connecting to its address";
      r.phase = Phase::kBootstrapping, r.detected_by = d0, r.mechanism = "registry record check";
      r.last_sign_of_life = {};
      break;
  }
  return r;
}

// The first line of the first ```text block under "### Example".
std::string ExampleMessage(const std::string& entry) {
  size_t at = entry.find("### Example");
  if (at == std::string::npos) return "";
  at = entry.find("```text\n", at);
  if (at == std::string::npos) return "";
  at += 8;
  return entry.substr(at, entry.find('\n', at) - at);
}

TEST(ErrorCatalog, CompiledInCatalogParses) {
  Result<std::vector<CatalogEntry>> parsed = ParseErrorCatalog(ErrorCatalogText());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->size(), ErrorCatalog().size());
}

TEST(ErrorCatalog, EveryCauseHasAnEntry) {
  for (FailureCause cause : AllFailureCauses()) {
    const std::string name(FailureCauseName(cause));
    EXPECT_NE(FindCatalogEntry(name), nullptr)
        << "docs/errors.md has no entry \"## `" << name << "`\"";
  }
}

TEST(ErrorCatalog, EveryEntryNamesACause) {
  ASSERT_FALSE(ErrorCatalog().empty());
  for (const CatalogEntry& e : ErrorCatalog()) {
    FailureCause cause;
    EXPECT_TRUE(ParseFailureCause(e.name, &cause))
        << "docs/errors.md has an entry for '" << e.name << "', which is no FailureCause";
  }
}

TEST(ErrorCatalog, EveryEntryHasTheSectionsAnOperatorNeeds) {
  for (const CatalogEntry& e : ErrorCatalog()) {
    for (const char* section :
         {"### Trigger scenarios", "### Common situations", "### What to do", "### Example"}) {
      EXPECT_NE(e.text.find(section), std::string::npos) << e.name << " lacks " << section;
    }
    EXPECT_LT(e.summary.size(), 160u) << e.name << ": the meaning should fit on one line";
  }
}

TEST(ErrorCatalog, ExampleMessagesAreWhatTheCodePrints) {
  for (FailureCause cause : AllFailureCauses()) {
    const CatalogEntry* e = FindCatalogEntry(FailureCauseName(cause));
    if (e == nullptr) continue;  // EveryCauseHasAnEntry reports it
    EXPECT_EQ(ExampleMessage(e->text), ExampleRecord(cause).Message())
        << "docs/errors.md, entry " << e->name << ": update the example message";
    EXPECT_NE(e->text.find(std::string(StatusCodeName(FailureCauseCode(cause)))), std::string::npos)
        << e->name << " does not name its status code";
  }
}

TEST(ParseErrorCatalog, FindsEntriesAndTheirMeaning) {
  Result<std::vector<CatalogEntry>> parsed = ParseErrorCatalog(
      "# Title\n\nIntro.\n\n## How to read\n\nProse.\n\n"
      "## `peer_exited`\n\nThe peer is gone,\nfor good.\n\nMore.\n\n"
      "```text\n## `not_an_entry`\n```\n"
      "## `aborted`\n\nSomeone aborted.\n");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[0].name, "peer_exited");
  EXPECT_EQ((*parsed)[0].summary, "The peer is gone, for good.");
  EXPECT_NE((*parsed)[0].text.find("not_an_entry"), std::string::npos);
  EXPECT_EQ((*parsed)[1].name, "aborted");
  EXPECT_EQ((*parsed)[1].summary, "Someone aborted.");
}

TEST(ParseErrorCatalog, RejectsDuplicatesAndEntriesWithoutMeaning) {
  Result<std::vector<CatalogEntry>> dup =
      ParseErrorCatalog("## `aborted`\n\nA.\n\n## `aborted`\n\nB.\n");
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.status().message().find("duplicate entry 'aborted'"), std::string::npos);
  Result<std::vector<CatalogEntry>> empty = ParseErrorCatalog("## `aborted`\n\n### What to do\n");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
}

TEST(RankIdTest, InstanceIsPartOfTheNameAndThePosition) {
  RankId a;
  a.role = Role::kDecode;
  a.tp = 1;
  a.host = "h";
  a.pid = 7;
  RankId b = a;
  b.instance = "b";
  EXPECT_EQ(a.ShortName(), "decode tp1");
  EXPECT_EQ(b.ShortName(), "decode[b] tp1");
  EXPECT_EQ(b.ToString(), "decode[b] tp1 (host h, pid 7)");
  EXPECT_FALSE(a.SameRank(b));
  b.instance.clear();
  EXPECT_TRUE(a.SameRank(b));
}

}  // namespace
}  // namespace kvbridge::internal
