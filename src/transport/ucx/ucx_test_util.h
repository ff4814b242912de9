// UCX transports for tests: TCP only, made in this process. Header-only (a
// .cc under src/ that is not *_test.cc would be built into the library).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "transport/ucx/ucx_transport.h"

namespace kvbridge::internal::testing {

// TCP only; `same_host` false makes every write go (and be acknowledged)
// over UCX.
inline UcxTransportOptions TcpTestOptions(const char* name, bool same_host) {
  UcxTransportOptions o;
  o.tls = "tcp";
  o.same_host_paths = same_host;
  o.name = name;
  return o;
}

// The transport, or null after a failed expectation naming why.
inline std::unique_ptr<Transport> MakeUcxForTest(const UcxTransportOptions& o) {
  auto t = CreateUcxTransport(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

}  // namespace kvbridge::internal::testing
