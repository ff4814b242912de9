// Test helpers that speak to a bootstrap registry as another rank would:
// publishing a rank's death, as a slow detector of the other role.
// Header-only (a .cc under src/ that is not *_test.cc is library code).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "control/auth.h"
#include "control/bootstrap_client.h"
#include "control/record_json.h"
#include "kvbridge/errors.h"

namespace kvbridge::internal {

// The record of `origin`'s death, as a transport error would say it.
inline FailureRecord DeathOf(const RankId& origin) {
  FailureRecord r;
  r.origin = origin;
  r.cause = FailureCause::kPeerExited;
  r.detail = "process exited";
  r.phase = Phase::kTransferring;
  r.mechanism = "transport error";
  r.detected_at = std::chrono::system_clock::now();
  r.last_sign_of_life = r.detected_at;
  return r;
}

// Publishes `record` to the registry at `server` as a slow detector would:
// a rank of the other role (the registry takes a rank's death from it) and
// of another instance (no sibling of any rank in these tests, so its
// silence fails nothing), registered for the purpose on `near`'s host. The
// registry takes records only from a registered rank, in its own name.
inline void PublishDeath(const std::string& server, const RankId& near, FailureRecord record) {
  auto client =
      BootstrapClient::Create(server, std::chrono::seconds(5), AuthTokenFromEnvironment());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  RankRecord detector;
  detector.role = record.origin.role == Role::kPrefill ? RankRole::kDecode : RankRole::kPrefill;
  detector.rank_ip = "127.0.0.1";
  detector.page_size = 16;
  detector.kv_cache_dtype = "bfloat16";
  detector.host = near.host;
  detector.incarnation = near.incarnation ^ 0x77;
  detector.instance = "slow-detector";
  ASSERT_TRUE((*client)->RegisterRank(detector).ok());
  record.detected_by = near;
  record.detected_by.role = detector.role == RankRole::kDecode ? Role::kDecode : Role::kPrefill;
  record.detected_by.incarnation = detector.incarnation;
  record.detected_by.instance = detector.instance;
  ASSERT_TRUE((*client)->PublishFailure(FailureRecordToJson(record)).ok());
}

}  // namespace kvbridge::internal
