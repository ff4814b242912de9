// Writes the seed corpus of the wire fuzz targets (fuzz/corpus/<target>/):
// a handful of valid encodings made by the encoders themselves, so each
// target starts from real messages.
//
//   fuzz_make_corpus DIR          writes DIR/<target>/<name> (DIR: fuzz/corpus)
//   fuzz_make_corpus --check DIR  exit 1, naming them, when committed seeds
//                                 differ from what the encoders make now
//
// Seeds of other targets (e.g. hand-written JSON) are left alone.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "common/base64.h"
#include "common/wire.h"
#include "connector/protocol.h"

using namespace kvbridge;            // NOLINT: a tool's own namespace
using namespace kvbridge::internal;  // NOLINT

namespace {

struct Seed {
  std::string target, name, bytes;
};

RankId Rank(Role role, int tp) {
  RankId r;
  r.role = role;
  r.tp = tp;
  r.host = "node-7";
  r.pid = 4321;
  r.incarnation = 0x1122334455667788ull;
  return r;
}

FailureRecord Record() {
  FailureRecord f;
  f.room = 42;
  f.generation = 3;
  f.origin = Rank(Role::kPrefill, 1);
  f.cause = FailureCause::kPeerExited;
  f.detail = "SIGKILL";
  f.phase = Phase::kTransferring;
  f.detected_by = Rank(Role::kDecode, 0);
  f.mechanism = "transport error";
  f.detected_at =
      std::chrono::system_clock::time_point(std::chrono::microseconds(1700000000000000));
  f.last_sign_of_life = f.detected_at - std::chrono::milliseconds(250);
  f.is_from_another_rank = true;
  return f;
}

RankLayout Layout() {  // decode tp 2 of an 8-head MHA model, 2 layers
  RankLayout l;
  l.page_size = 16;
  l.dtype = "bfloat16";
  l.tp_size = 2;
  l.tp_rank = 0;
  l.total_kv_heads = 8;
  l.kv_heads = 4;
  l.end_layer = 2;
  for (uint64_t i = 0; i < 4; ++i) l.kv.push_back({0x100000 * (i + 1), 64 * 8192, 8192});
  l.kv_layer_ids = {0, 1, 0, 1};  // K then V of layers 0 and 1, as sglang numbers them
  l.aux.push_back({0x900000, 64 * 64, 64});
  l.state.push_back({0xa00000, 8 * 32, 32});
  l.state.push_back({0xb00000, 8 * 32, 32});
  l.state_types = {0, 1};                 // two state components
  l.state_layer_ids = {-1, 1};            // the second named by model layer
  l.state_type_names = {"MAMBA", "SWA"};  // sglang's StateType of each
  return l;
}

struct Call {
  uint8_t kind;
  int64_t a, b;
};
std::string Script(bool crc, const std::vector<Call>& calls, const std::string& blob) {
  std::string out{static_cast<char>(crc ? 1 : 0), static_cast<char>(calls.size())};
  for (const Call& c : calls) {
    out.push_back(static_cast<char>(c.kind));
    out.append(reinterpret_cast<const char*>(&c.a), 8);
    out.append(reinterpret_cast<const char*>(&c.b), 8);
  }
  return out + blob;
}

std::vector<Seed> Seeds() {
  const RankId decode = Rank(Role::kDecode, 0);
  const RankId prefill = Rank(Role::kPrefill, 1);
  RankId named = decode;
  named.instance = "decode-b";
  const std::string addr = "ucx:\x01\x02\x03 worker address";
  HelloMsg hello{Layout(), 2, addr, {"kv0", "kv1", "kv2", "kv3"}, {"aux0"}, {"state0", "state1"}};
  hello.session = 0x5e55;
  hello.nonce.fill(0xa5);
  FailureRecord bootstrap = Record();
  bootstrap.origin = RankId{};
  bootstrap.origin.role = Role::kBootstrap;
  bootstrap.origin.host = "127.0.0.1:8998";
  bootstrap.cause = FailureCause::kRegistryLost;

  std::vector<Seed> s = {
      {"control_message", "hello", EncodeMessage(named, hello)},
      {"control_message", "hello_ack_ok",
       EncodeMessage(prefill, HelloAckMsg{StatusCode::kOk, "", addr})},
      {"control_message", "hello_ack_refused",
       EncodeMessage(prefill, HelloAckMsg{StatusCode::kFailedPrecondition,
                                          "page size mismatch: prefill 16, decode 32", addr})},
      {"control_message", "meta",
       EncodeMessage(decode, MetaMsg{42, 3, 2, false, {4, 5, 9, 10}, 1, {2}, 1})},
      {"control_message", "meta_dummy",
       EncodeMessage(decode, MetaMsg{42, 3, 2, true, {}, -1, {}, 0})},
      {"control_message", "notify", EncodeMessage(prefill, NotifyMsg{42, 3, 0, false, 3})},
      {"control_message", "notify_last", EncodeMessage(prefill, NotifyMsg{42, 3, 1, true, 0})},
      {"control_message", "room_failed",
       EncodeMessage(prefill, RoomFailedMsg{42, 3, true, Record()})},
      {"control_message", "room_failed_bootstrap",
       EncodeMessage(decode, RoomFailedMsg{42, 3, false, bootstrap})},
      {"control_message", "quiesced", EncodeMessage(prefill, QuiescedMsg{42, 3})},
      {"control_message", "heartbeat", EncodeMessage(decode, HeartbeatMsg{17})},
      {"control_message", "rank_failed", EncodeMessage(prefill, RankFailedMsg{Record()})},
      {"control_message", "hello_challenge",
       EncodeMessage(prefill, HelloChallengeMsg{0x5e55, 0x7a11, Nonce{1, 2, 3}, Digest{4, 5, 6}})},
      {"control_message", "hello_proof",
       EncodeMessage(decode,
                     HelloProofMsg{0x7a11, Digest{7}, EncodeMessage(decode, HeartbeatMsg{17})})},
      {"failure_record", "peer_exited", EncodeFailureRecord(Record())},
      {"failure_record", "registry_lost", EncodeFailureRecord(bootstrap)},
      {"base64", "empty", ""},
      {"base64", "one_pad", Base64Encode("fo")},
      {"base64", "two_pad", Base64Encode("f")},
      {"base64", "address", Base64Encode(addr)},
      {"base64", "record", Base64Encode(EncodeFailureRecord(Record()))},
  };
  // wire_reader: scripts (see fuzz/wire_reader.cc) that read a message's
  // header and a record blob's first fields.
  const std::string meta = EncodeMessage(decode, MetaMsg{42, 3, 2, false, {4, 5}, 1, {}, 0});
  s.push_back({"wire_reader", "message_header",
               Script(false,
                      {{1, 0, 0},                         // magic
                       {0, 0, 0},                         // type
                       {0, 0, 0},                         // role
                       {6, 0, int64_t{1023} << 32},       // dp
                       {6, 0, int64_t{1023} << 32},       // tp
                       {7, 0, 1023},                      // pp
                       {7, 0, 1023},                      // cp
                       {9, 256, 0},                       // host
                       {6, 0, int64_t{INT32_MAX} << 32},  // pid
                       {2, 0, 0},                         // incarnation
                       {4, 0, 0},                         // instance
                       {2, 0, 0},                         // room
                       {2, 0, 0},                         // generation
                       {7, 1, 1024},                      // decode_tp_size
                       {0, 0, 0},                         // dummy
                       {10, 4, 1 << 24}},                 // page count
                      meta)});
  const std::string record = EncodeFailureRecord(Record());
  s.push_back(
      {"wire_reader", "record_with_crc", Script(true, {{2, 0, 0}, {3, 0, 0}, {8, 0, 2}}, record)});
  s.push_back({"wire_reader", "bytes_views", Script(false, {{5, 0, 0}, {4, 0, 0}}, [] {
                 WireWriter w;
                 w.Bytes("address");
                 w.Bytes("");
                 return w.Finish();
               }())});
  return s;
}

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  const bool check = argc == 3 && std::string(argv[1]) == "--check";
  if (argc != 2 && !check) {
    std::fprintf(stderr, "usage: %s [--check] CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[argc - 1];
  int stale = 0;
  for (const Seed& seed : Seeds()) {
    const std::filesystem::path p = dir / seed.target / seed.name;
    if (check) {
      if (!std::filesystem::exists(p) || ReadFile(p) != seed.bytes) {
        std::fprintf(stderr, "stale or missing seed %s\n", p.c_str());
        ++stale;
      }
      continue;
    }
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << seed.bytes;
  }
  if (stale > 0) {
    std::fprintf(stderr, "%d seed(s) differ from the encoders: regenerate with %s %s\n", stale,
                 argv[0], dir.c_str());
    return 1;
  }
  return 0;
}
