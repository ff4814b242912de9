// Helpers shared by the connector's transfer tests (connector_test.cc,
// pp_test.cc): a request's pages, bringing it to WaitingForInput on every
// rank of a TestCluster, sending it in chunks and checking every byte that
// landed.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "connector/manager_impl.h"
#include "connector/test_cluster.h"
#include "transport/fault/fault_transport.h"
#include "transport/test_util.h"

namespace kvbridge::internal {

// `count` distinct pages of a pool of `pool_pages`, shuffled by `seed`, the
// first half sorted (runs of consecutive pages, as a paged allocator gives).
inline std::vector<int32_t> Scattered(int count, int pool_pages, uint32_t seed) {
  std::vector<int32_t> all(pool_pages);
  std::iota(all.begin(), all.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(count);
  std::sort(all.begin(), all.begin() + count / 2);
  return all;
}

// Wraps every transport of a cluster in a FaultTransport, collected in
// creation order (prefill ranks first).
inline std::function<std::unique_ptr<Transport>(std::unique_ptr<Transport>, Role, int)>
WrapInFaults(std::vector<FaultTransport*>* faults) {
  return [faults](std::unique_ptr<Transport> t, Role, int) -> std::unique_ptr<Transport> {
    auto f = std::make_unique<FaultTransport>(std::move(t));
    faults->push_back(f.get());
    return f;
  };
}

// Everything prefill's worker ran before `done`'s write: the loopback
// transport runs one endpoint's batches in order, so a write posted through
// prefill's transport after the released batches completes after them.
inline void BarrierBehindPrefillWrites(FaultTransport& prefill, FaultTransport& decode) {
  std::vector<uint8_t> src(64, 1), dst(64, 0);
  auto s = prefill.inner().RegisterMemory(src.data(), src.size(), MemoryKind::kDram);
  auto d = decode.inner().RegisterMemory(dst.data(), dst.size(), MemoryKind::kDram);
  ASSERT_TRUE(s.ok() && d.ok());
  auto peer = prefill.inner().Connect(decode.Address());
  ASSERT_TRUE(peer.ok());
  auto remote = prefill.inner().ImportRegion(*peer, d->remote_key);
  ASSERT_TRUE(remote.ok());
  testing::Completions done;
  ASSERT_TRUE(
      prefill.inner().PostWrites(*peer, {WriteOp{s->id, 0, *remote, 0, 64}}, done.Callback()).ok());
  ASSERT_TRUE(done.Wait(1)[0].ok());
  EXPECT_EQ(dst[0], 1);
  prefill.inner().Disconnect(*peer);
  ASSERT_TRUE(prefill.inner().DeregisterMemory(s->id).ok());
  ASSERT_TRUE(decode.inner().DeregisterMemory(d->id).ok());
}

// The endpoint `from` talks to `to` on, once their handshake proved both:
// what a test sends on it through `from`'s transport is sealed as `from`'s.
inline PeerId ProvenEndpoint(KVManager& from, const RankId& to) {
  for (const PeerSnapshot& p : ManagerAccess::Of(from).Peers())
    if (p.id.SameRank(to) && p.ready && !p.failed) return p.endpoint;
  ADD_FAILURE() << "no proven endpoint to " << to.ToString();
  return 0;
}

// What `m` knows of the rank at `id`'s position.
inline std::optional<PeerSnapshot> PeerAt(ManagerImpl& m, const RankId& id) {
  for (const PeerSnapshot& p : m.Peers())
    if (p.id.SameRank(id)) return p;
  return std::nullopt;
}

struct Request {
  uint64_t room = 0;
  std::vector<int32_t> src = {}, dst = {};
  int64_t src_aux = 1, dst_aux = 2;
  std::vector<int32_t> src_state{3}, dst_state{5};
  // One per rank, in the cluster's order (TestCluster::prefill / ::decode).
  std::vector<std::unique_ptr<KVSender>> senders = {};
  std::vector<std::unique_ptr<KVReceiver>> receivers = {};
};

// Creates receivers (Init + SendMetadata) and senders on every rank, fills
// every prefill pool with the request's pattern, waits for WaitingForInput
// and calls Init on every sender.
inline void Start(TestCluster& c, Request& r, bool senders_first) {
  auto make_senders = [&] {
    for (auto& p : c.prefill) {
      auto s = KVSender::Create(*p.manager, r.room);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      r.senders.push_back(std::move(s).value());
    }
  };
  if (senders_first) make_senders();
  for (auto& d : c.decode) {
    auto rc = KVReceiver::Create(*d.manager, r.room);
    ASSERT_TRUE(rc.ok()) << rc.status().ToString();
    Status init = (*rc)->Init(0);
    ASSERT_TRUE(init.ok()) << init.ToString();
    Status meta = (*rc)->SendMetadata(r.dst, r.dst_aux, r.dst_state);
    ASSERT_TRUE(meta.ok()) << meta.ToString();
    r.receivers.push_back(std::move(rc).value());
  }
  if (!senders_first) make_senders();
  for (auto& p : c.prefill) p.pool->Fill(r.room, r.src, r.src_aux, r.src_state);
  ASSERT_TRUE(WaitFor([&] {
    for (auto& s : r.senders)
      if (s->Poll() != KVPoll::kWaitingForInput) return false;
    return true;
  })) << "senders stuck in "
      << KVPollName(r.senders[0]->Poll());
  for (auto& s : r.senders) ASSERT_TRUE(s->Init(r.src.size(), r.src_aux).ok());
}

// Sends the request's pages in chunks of `chunk_sizes` from every sender; the
// chunk completing the pages carries the state slots.
inline void SendChunks(Request& r, const std::vector<int>& chunk_sizes) {
  size_t pos = 0;
  for (size_t c = 0; c < chunk_sizes.size(); ++c) {
    std::span<const int32_t> chunk(r.src.data() + pos, chunk_sizes[c]);
    pos += chunk_sizes[c];
    bool last = pos == r.src.size();
    for (auto& s : r.senders) {
      Status st =
          s->Send(chunk, last ? std::span<const int32_t>(r.src_state) : std::span<const int32_t>());
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
  }
}

// Waits for Success on every sender and receiver of `r`; the failure
// otherwise names the first sender's and receiver's state and record.
inline void WaitForSuccess(Request& r) {
  ASSERT_TRUE(WaitFor([&] {
    for (auto& s : r.senders)
      if (s->Poll() != KVPoll::kSuccess) return false;
    for (auto& d : r.receivers)
      if (d->Poll() != KVPoll::kSuccess) return false;
    return true;
  })) << "sender "
      << KVPollName(r.senders[0]->Poll()) << ", receiver " << KVPollName(r.receivers[0]->Poll())
      << (r.receivers[0]->Failure() ? ": " + r.receivers[0]->Failure()->Message() : "")
      << (r.senders[0]->Failure() ? ": " + r.senders[0]->Failure()->Message() : "");
}

// Waits for Success on every sender and receiver, then checks every byte of
// every destination page, the aux row and the state slots on every decode
// rank (each decode stage's from the prefill stage it reads).
inline void ExpectDelivered(TestCluster& c, Request& r) {
  ASSERT_NO_FATAL_FAILURE(WaitForSuccess(r));
  for (auto& d : r.receivers) EXPECT_TRUE(d->Quiesced());
  // Every decode rank holds its aux row and state (each stage's from the
  // stage it reads).
  for (size_t i = 0; i < c.decode.size(); ++i) {
    EXPECT_EQ(c.decode[i].pool->CountCorruptPages(r.room, r.dst), 0u) << "decode rank " << i;
    EXPECT_TRUE(c.decode[i].pool->AuxMatches(r.room, r.dst_aux)) << "decode rank " << i;
    EXPECT_TRUE(c.decode[i].pool->StateMatches(r.room, r.dst_state)) << "decode rank " << i;
  }
}

// Payload bytes every prefill rank of `c` has written so far.
inline uint64_t PrefillBytesWritten(TestCluster& c) {
  uint64_t sum = 0;
  for (auto& p : c.prefill) sum += p.manager->Stats().bytes_written;
  return sum;
}

// The bytes request `r` fills on the decode ranks of `c`, from their own
// pools: every kv buffer's destination pages, every aux buffer's row and
// every state buffer's slots. A request whose bytes were each written once
// costs the prefill ranks exactly this.
inline uint64_t DecodeBytesNeeded(TestCluster& c, const Request& r) {
  uint64_t sum = 0;
  for (auto& d : c.decode) {
    const KvPool& pool = *d.pool;
    sum += pool.page_bytes() * pool.num_kv_buffers() * r.dst.size();
    if (r.dst_aux >= 0) sum += uint64_t(pool.shape().aux_item_len) * pool.num_aux_buffers();
    sum += uint64_t(pool.shape().state_item_len) * pool.num_state_buffers() * r.dst_state.size();
  }
  return sum;
}

}  // namespace kvbridge::internal
