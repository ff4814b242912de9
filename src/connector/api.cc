// The public classes: thin handles over ManagerImpl and the room states.
#include "connector/api_internal.h"
#include "connector/last_words.h"
#include "connector/manager_impl.h"
#include "kvbridge/manager.h"
#include "kvbridge/receiver.h"
#include "kvbridge/sender.h"

namespace kvbridge {

using internal::ManagerAccess;

KVManager::KVManager(std::unique_ptr<internal::ManagerImpl> impl) : impl_(std::move(impl)) {}
KVManager::~KVManager() { internal::RemoveLastWords(impl_.get()); }

Result<std::unique_ptr<KVManager>> KVManager::Create(const ManagerOptions& options) {
  return internal::CreateManager(options, nullptr);
}

RankId KVManager::self() const { return impl_->self(); }
const ManagerOptions& KVManager::options() const { return impl_->options(); }
const std::string& KVManager::bootstrap_addr() const { return impl_->bootstrap_addr(); }
void KVManager::ReportFatal(const std::string& reason) { impl_->ReportFatal(reason); }
ManagerStats KVManager::Stats() const { return impl_->Stats(); }
int KVManager::metrics_port() const { return impl_->metrics_port(); }
Result<std::vector<uint64_t>> KVManager::TakeChangedRooms() { return impl_->TakeChangedRooms(); }
std::optional<FailureRecord> KVManager::RecentRankFailure() const {
  return impl_->RecentRankFailure();
}

namespace internal {
std::unique_ptr<KVManager> ManagerAccess::Wrap(std::unique_ptr<ManagerImpl> impl) {
  return std::unique_ptr<KVManager>(new KVManager(std::move(impl)));
}

Result<std::unique_ptr<KVManager>> CreateManager(const ManagerOptions& options,
                                                 std::unique_ptr<Transport> transport) {
  return CreateManager(options, std::move(transport), CoreHooks{});
}

Result<std::unique_ptr<KVManager>> CreateManager(const ManagerOptions& options,
                                                 std::unique_ptr<Transport> transport,
                                                 CoreHooks hooks) {
  KVB_ASSIGN_OR_RETURN(auto impl,
                       ManagerImpl::Create(options, std::move(transport), std::move(hooks)));
  InstallLastWords(impl.get());
  return ManagerAccess::Wrap(std::move(impl));
}
}  // namespace internal

// KVSender.
KVSender::KVSender(KVManager& manager, std::shared_ptr<internal::SenderRoom> room)
    : manager_(manager), room_(std::move(room)) {}
KVSender::~KVSender() { ManagerAccess::Of(manager_).ReleaseSender(room_); }

Result<std::unique_ptr<KVSender>> KVSender::Create(KVManager& manager, uint64_t room) {
  if (manager.options().role != Role::kPrefill)
    return FailedPreconditionError("KVSender needs a prefill manager");
  KVB_ASSIGN_OR_RETURN(auto r, ManagerAccess::Of(manager).NewSender(room));
  return std::unique_ptr<KVSender>(new KVSender(manager, std::move(r)));
}
uint64_t KVSender::room() const { return room_->room; }
Status KVSender::Init(int64_t num_pages, int64_t aux_index) {
  return ManagerAccess::Of(manager_).SenderInit(*room_, num_pages, aux_index);
}
Status KVSender::Send(std::span<const int32_t> pages, std::span<const int32_t> state) {
  return ManagerAccess::Of(manager_).SenderSend(room_, pages, state);
}
KVPoll KVSender::Poll() const { return room_->poll(); }
std::optional<FailureRecord> KVSender::Failure() const {
  return ManagerAccess::Of(manager_).SenderFailure(*room_);
}
FailureRecord KVSender::GroupFailure() const {
  return ManagerAccess::Of(manager_).GroupFailure(*room_);
}
void KVSender::Abort() { ManagerAccess::Of(manager_).SenderAbort(room_); }
void KVSender::Reject(std::string reason) {
  ManagerAccess::Of(manager_).SenderAbort(room_, FailureCause::kInvalidRequest, std::move(reason),
                                          "Reject()");
}
int64_t KVSender::DecodePrefixPages() const {
  return room_->decode_prefix_pages.load(std::memory_order_acquire);
}
TransferTiming KVSender::Timing() const {
  auto seconds = [](int64_t from_ns, int64_t to_ns) -> std::optional<double> {
    if (from_ns == 0 || to_ns == 0) return std::nullopt;
    return static_cast<double>(to_ns - from_ns) / 1e9;
  };
  const int64_t created =
      std::chrono::duration_cast<std::chrono::nanoseconds>(room_->created.time_since_epoch())
          .count();
  return {seconds(created, room_->metadata_done_ns.load(std::memory_order_relaxed)),
          seconds(room_->first_write_ns.load(std::memory_order_relaxed),
                  room_->writes_done_ns.load(std::memory_order_relaxed))};
}

// KVReceiver.
KVReceiver::KVReceiver(KVManager& manager, std::shared_ptr<internal::ReceiverRoom> room)
    : manager_(manager), room_(std::move(room)) {}
KVReceiver::~KVReceiver() { ManagerAccess::Of(manager_).ReleaseReceiver(room_); }

Result<std::unique_ptr<KVReceiver>> KVReceiver::Create(KVManager& manager, uint64_t room) {
  if (manager.options().role != Role::kDecode)
    return FailedPreconditionError("KVReceiver needs a decode manager");
  KVB_ASSIGN_OR_RETURN(auto r, ManagerAccess::Of(manager).NewReceiver(room));
  return std::unique_ptr<KVReceiver>(new KVReceiver(manager, std::move(r)));
}
uint64_t KVReceiver::room() const { return room_->room; }
uint64_t KVReceiver::generation() const { return room_->generation; }
Status KVReceiver::Init(int prefill_dp_rank) {
  return ManagerAccess::Of(manager_).ReceiverInit(room_, prefill_dp_rank);
}
Status KVReceiver::SendMetadata(std::span<const int32_t> pages, int64_t aux_index,
                                std::span<const int32_t> state, int64_t decode_prefix_len) {
  return ManagerAccess::Of(manager_).ReceiverSendMetadata(room_, pages, aux_index, state,
                                                          decode_prefix_len);
}
KVPoll KVReceiver::Poll() const { return room_->poll(); }
std::optional<FailureRecord> KVReceiver::Failure() const {
  return ManagerAccess::Of(manager_).ReceiverFailure(*room_);
}
FailureRecord KVReceiver::GroupFailure() const {
  return ManagerAccess::Of(manager_).GroupFailure(*room_);
}
void KVReceiver::Abort() { ManagerAccess::Of(manager_).ReceiverAbort(room_); }
void KVReceiver::Reject(std::string reason) {
  ManagerAccess::Of(manager_).ReceiverAbort(room_, FailureCause::kInvalidRequest, std::move(reason),
                                            "Reject()");
}
bool KVReceiver::Quiesced() const { return room_->quiesced.load(std::memory_order_acquire); }
KVPoll KVReceiver::PollSettled() const {
  const KVPoll p = room_->poll();
  if (p != KVPoll::kFailed || room_->quiesced.load(std::memory_order_acquire)) return p;
  const auto failed_at = std::chrono::steady_clock::time_point(
      std::chrono::steady_clock::duration(room_->failed_at_ns.load(std::memory_order_relaxed)));
  if (ManagerAccess::Of(manager_).Now() - failed_at >= manager_.options().quiesce_timeout) return p;
  return static_cast<KVPoll>(room_->state_before_failure.load(std::memory_order_relaxed));
}
FailureRecord KVReceiver::FailAsGroup() {
  return ManagerAccess::Of(manager_).ReceiverFailAsGroup(room_);
}
bool KVReceiver::WaitQuiesced(std::chrono::milliseconds timeout) const {
  return ManagerAccess::Of(manager_).WaitReceiverQuiesced(*room_, timeout);
}

}  // namespace kvbridge
