// Target process of tests/integration/transport_test.cc.
//
// Usage: transport_peer <tls|-> <same_host_paths 0|1> <malloc|shared> <bytes>
// Creates a UCX transport, allocates and registers a zeroed region, prints
// "ADDR <hex>", "RKEY <hex>", "READY" on stdout, then checks every control
// message against its memory (see transport_pattern.h) and answers "ACK ...".
// "PEEK <offset> <length> <seed>" on stdin checks the region at once, outside
// the transport (answers "PEEK OK" or "PEEK FAIL ..."). "DEREG" deregisters the region (prints
// "DEREGISTERED"): later incoming writes must be refused. Exits cleanly on "QUIT" or EOF on stdin
// (prints "BYE").
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "kvbridge/memory.h"
#include "tests/integration/transport_pattern.h"
#include "transport/ucx/ucx_transport.h"

using namespace kvbridge;
using namespace kvbridge::internal;
using kvbridge::testing::FindPatternMismatch;

namespace {

std::mutex out_mu;

void Say(const std::string& line) {
  std::lock_guard<std::mutex> lock(out_mu);
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s <tls|-> <same_host_paths> <malloc|shared> <bytes>\n", argv[0]);
    return 2;
  }
  UcxTransportOptions options;
  options.tls = std::strcmp(argv[1], "-") == 0 ? "" : argv[1];
  options.same_host_paths = std::atoi(argv[2]) != 0;
  options.name = "transport_peer";
  const bool shared = std::strcmp(argv[3], "shared") == 0;
  const size_t size = std::strtoull(argv[4], nullptr, 10);

  uint8_t* buf = nullptr;
  if (shared) {
    auto mem = AllocateSharedBuffer(size);
    if (!mem.ok()) {
      std::fprintf(stderr, "AllocateSharedBuffer: %s\n", mem.status().ToString().c_str());
      return 1;
    }
    buf = static_cast<uint8_t*>(*mem);
  } else {
    buf = static_cast<uint8_t*>(std::aligned_alloc(4096, size));
    std::memset(buf, 0, size);
  }
  int rc = 0;
  {
    auto created = CreateUcxTransport(options);
    if (!created.ok()) {
      std::fprintf(stderr, "CreateUcxTransport: %s\n", created.status().ToString().c_str());
      return 1;
    }
    std::unique_ptr<Transport> transport = std::move(*created);
    uint64_t expected_seq = 1;
    transport->SetMessageHandler([&](std::string_view payload) {
      std::istringstream in{std::string(payload)};
      std::string kind;
      uint64_t seq = 0, offset = 0, length = 0, seed = 0;
      in >> kind >> seq >> offset >> length;
      std::string verdict = "OK";
      if (seq != expected_seq) {
        verdict = "FAIL out of order: got " + std::to_string(seq) + " expected " +
                  std::to_string(expected_seq);
      } else if (offset > size || length > size - offset) {
        verdict = "FAIL bad range";
      } else if (kind == "CHECK") {
        in >> seed;
        if (auto bad = FindPatternMismatch(buf, offset, length, seed)) {
          verdict = "FAIL pattern mismatch at offset " + std::to_string(*bad);
        }
      } else if (kind == "ZERO") {
        static const std::vector<uint8_t> kZeros(1 << 20, 0);
        for (uint64_t at = offset; at < offset + length; at += kZeros.size()) {
          uint64_t n = std::min<uint64_t>(kZeros.size(), offset + length - at);
          if (std::memcmp(buf + at, kZeros.data(), n) != 0) {
            verdict =
                "FAIL nonzero byte in [" + std::to_string(at) + ", +" + std::to_string(n) + ")";
            break;
          }
        }
      } else {
        verdict = "FAIL unknown message " + kind;
      }
      expected_seq = seq + 1;
      Say("ACK " + std::to_string(seq) + " " + verdict);
    });
    auto region = transport->RegisterMemory(buf, size, MemoryKind::kDram);
    if (!region.ok()) {
      std::fprintf(stderr, "RegisterMemory: %s\n", region.status().ToString().c_str());
      return 1;
    }
    Say("ADDR " + kvbridge::testing::ToHex(transport->Address()));
    Say("RKEY " + kvbridge::testing::ToHex(region->remote_key));
    Say("READY");
    std::string line;
    bool registered = true;
    while (std::getline(std::cin, line) && line != "QUIT") {
      if (line.rfind("PEEK ", 0) == 0) {
        std::istringstream in(line.substr(5));
        uint64_t offset = 0, length = 0, seed = 0;
        in >> offset >> length >> seed;
        if (offset > size || length > size - offset) {
          Say("PEEK FAIL bad range");
        } else if (auto bad = FindPatternMismatch(buf, offset, length, seed)) {
          Say("PEEK FAIL pattern mismatch at offset " + std::to_string(*bad));
        } else {
          Say("PEEK OK");
        }
      }
      if (line == "DEREG" && registered) {
        if (!transport->DeregisterMemory(region->id).ok()) rc = 1;
        registered = false;
        Say("DEREGISTERED");
      }
    }
    if (registered && !transport->DeregisterMemory(region->id).ok()) rc = 1;
  }
  if (shared) {
    if (!FreeSharedBuffer(buf).ok()) rc = 1;
  } else {
    std::free(buf);
  }
  Say("BYE");
  return rc;
}
