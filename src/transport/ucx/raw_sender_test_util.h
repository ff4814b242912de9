// RawSender: a UCX endpoint that speaks the transport's active messages by
// hand, as a forger would (tests only; header-only: a .cc under src/ that is
// not *_test.cc would be built into the library).
#pragma once

#include <gtest/gtest.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "transport/ucx/ucx_blobs.h"
#include "transport/ucx/ucx_handles.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace kvbridge::internal::ucx {

// A sender that speaks the data AM protocol by hand, as a forger would.
class RawSender {
 public:
  explicit RawSender(const std::string& target_address) {
    ucp_config_t* raw_config = nullptr;
    EXPECT_EQ(ucp_config_read(nullptr, nullptr, &raw_config), UCS_OK);
    UcpConfig config(raw_config);
    EXPECT_EQ(ucp_config_modify(config.get(), "TLS", "tcp"), UCS_OK);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    ucp_context_h ctx = nullptr;
    EXPECT_EQ(ucp_init(&params, config.get(), &ctx), UCS_OK);
    context_ = UcpContext(ctx);
    ucp_worker_params_t wp{};
    ucp_worker_h worker = nullptr;
    EXPECT_EQ(ucp_worker_create(context_.get(), &wp, &worker), UCS_OK);
    worker_ = UcpWorker(worker);
    ucp_am_handler_param_t h{};
    h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                   UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    h.id = kAmAck;
    h.flags = UCP_AM_FLAG_WHOLE_MSG;
    h.cb = [](void* arg, const void* header, size_t header_length, void* data, size_t length,
              const ucp_am_recv_param_t*) -> ucs_status_t {
      AckHeader a{};
      if (header_length == sizeof(a)) std::memcpy(&a, header, sizeof(a));
      static_cast<RawSender*>(arg)->acks_.push_back(
          {a, std::string(static_cast<const char*>(data), length)});
      return UCS_OK;
    };
    h.arg = this;
    EXPECT_EQ(ucp_worker_set_am_recv_handler(worker_.get(), &h), UCS_OK);
    auto addr = DecodeAddress(target_address);
    EXPECT_TRUE(addr.ok());
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = reinterpret_cast<const ucp_address_t*>(addr->worker_address.data());
    ucp_ep_h handle = nullptr;
    EXPECT_EQ(ucp_ep_create(worker_.get(), &ep, &handle), UCS_OK);
    ep_ = UcpEp(handle);
  }
  ~RawSender() {
    ep_ = UcpEp();
    for (int i = 0; i < 100; ++i) ucp_worker_progress(worker_.get());
  }

  // Starts one rendezvous AM (a data AM unless told) and returns its
  // request (null: done).
  ucs_status_ptr_t StartRndv(const void* header, size_t header_length, const void* data,
                             size_t length, unsigned am = kAmData) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_RNDV;
    ucs_status_ptr_t req = ucp_am_send_nbx(ep_.get(), am, header, header_length, data, length, &p);
    EXPECT_FALSE(UCS_PTR_IS_ERR(req));
    return UCS_PTR_IS_ERR(req) ? nullptr : req;
  }
  void Progress() { ucp_worker_progress(worker_.get()); }
  // Progresses until `req` completes (or 20 s passed), then frees it.
  void Finish(ucs_status_ptr_t req) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (req != nullptr && ucp_request_check_status(req) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker_.get());
    }
    if (req != nullptr) ucp_request_free(req);
  }

  // Sends one eager AM (a data AM unless told) with `header` and waits
  // until it has left.
  void Send(const void* header, size_t header_length, const void* data, size_t length,
            unsigned am = kAmData) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t req = ucp_am_send_nbx(ep_.get(), am, header, header_length, data, length, &p);
    ASSERT_FALSE(UCS_PTR_IS_ERR(req));
    if (req == nullptr) return;
    while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker_.get());
    ucp_request_free(req);
  }
  // Progresses until `n` ACKs arrived (or 20 s passed).
  const std::vector<std::pair<AckHeader, std::string>>& WaitAcks(size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (acks_.size() < n && std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker_.get());
    }
    return acks_;
  }

 private:
  UcpContext context_;
  UcpWorker worker_;
  UcpEp ep_;
  std::vector<std::pair<AckHeader, std::string>> acks_;
};

}  // namespace kvbridge::internal::ucx
