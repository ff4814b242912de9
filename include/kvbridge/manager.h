// KVManager: one per rank. Registers the rank's KV memory with the transport,
// registers the rank with the bootstrap registry (prefill rank 0 embeds the
// bootstrap server by default), owns the transfer engine, watches the liveness
// of the ranks it talks to, and turns every failure into a FailureRecord on
// the requests it touches.
//
// Thread safety: all methods are thread-safe. Senders and receivers created
// from a manager must be destroyed before it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvbridge/errors.h"
#include "kvbridge/export.h"
#include "kvbridge/options.h"
#include "kvbridge/status.h"

namespace kvbridge {

class KVManager;

namespace internal {
class ManagerImpl;
class ManagerAccess;  // the library's own access to the implementation
class Transport;
Result<std::unique_ptr<KVManager>> CreateManager(const ManagerOptions& options,
                                                 std::unique_ptr<Transport> transport);
}  // namespace internal

// Counters for tests, metrics and the CLI.
struct ManagerStats {
  uint64_t rooms_live = 0;  // senders/receivers not yet destroyed
  uint64_t rooms_bootstrapping = 0;
  uint64_t rooms_waiting = 0;
  uint64_t rooms_transferring = 0;
  uint64_t rooms_succeeded = 0;  // total
  uint64_t rooms_failed = 0;     // total
  uint64_t bytes_written = 0;    // prefill: payload bytes posted and completed
  uint64_t write_ops = 0;        // coalesced writes posted
  uint64_t chunks_sent = 0;
  // Late messages dropped: of an old room generation, or failure records
  // about a process that was already replaced at its position.
  uint64_t stale_messages_dropped = 0;
  // Times this process rejoined under a new incarnation after the others
  // had declared it failed (a partition healed, a stopped rank resumed).
  uint64_t rejoins = 0;
  // Registry rounds in which a rejoin waited because writes its old
  // incarnation posted were still in flight (they finish first).
  uint64_t rejoin_waits = 0;
  // Control messages dropped as invalid: garbled, past a limit (the wire
  // decoder's), or disagreeing with what their sender declared at its
  // handshake (e.g. a Meta whose decode tp size is not its Hello's). Each is
  // logged once, with the reason.
  uint64_t invalid_messages_dropped = 0;
  // Control messages dropped because no handshake proved their sender:
  // plain messages that are not part of a handshake, sealed ones under an
  // unknown session or with a wrong tag or a replayed sequence number,
  // messages naming another rank than their session proved, Hellos whose
  // address is not tagged under the secret, and handshake answers whose
  // proof fails (docs/security.md, "Peers prove who they are").
  uint64_t unauthenticated_messages_dropped = 0;
  uint64_t pending_metadata = 0;  // metadata waiting for its sender
  // New requests a dead rank's failure record would block, waiting for the
  // registry thread to say whether that rank has restarted (they fail, naming
  // it, unless it has; KVSender/KVReceiver::Create never ask the registry).
  uint64_t rooms_awaiting_restart_check = 0;
  uint64_t peers_connected = 0;
  // Decode: handshakes the prefill ranks held now refused because a failure
  // record declared this process failed (it fences itself once its
  // registry says so, and rejoins).
  uint64_t handshakes_refused_as_declared_failed = 0;
  // Liveness rounds the ticker ran (heartbeats sent, silences and deadlines
  // checked): one per heartbeat interval while nothing holds it up.
  uint64_t heartbeat_rounds = 0;
  // Failure records this rank has for the registry that the registry does
  // not hold yet (it did not answer: they go in a later round, the oldest
  // 1024 kept). Always 0 with sglang's server, which keeps no records (the
  // ranks tell each other).
  uint64_t failure_records_unpublished = 0;
};

class KVB_EXPORT KVManager {
 public:
  // Validates options (InvalidArgument naming the field), registers memory,
  // starts the transport and, for prefill, registers with the bootstrap
  // server (Unavailable naming it when unreachable).
  static Result<std::unique_ptr<KVManager>> Create(const ManagerOptions& options);
  ~KVManager();
  KVManager(const KVManager&) = delete;
  KVManager& operator=(const KVManager&) = delete;

  // This rank; its incarnation changes when the rank rejoins after being
  // declared failed (docs/protocol.md), so it is returned by value.
  RankId self() const;
  const ManagerOptions& options() const;
  // Where the bootstrap server is ("host:port").
  const std::string& bootstrap_addr() const;

  // The application hit a fatal error (e.g. out of memory): every live
  // request on this rank fails with cause kLocalError and `reason`, and every
  // rank that shares a request with this one learns it. Best effort; returns
  // after the reports were sent.
  void ReportFatal(const std::string& reason);

  ManagerStats Stats() const;
  // Port of the Prometheus endpoint (ManagerOptions::metrics_port), 0 = off.
  int metrics_port() const;

  // The latest failure of a rank (another one, or this one) that this rank
  // knows of. For a request that a group-wide poll reports Failed while it
  // did not fail here (sglang's "exception from another rank"): this names
  // the rank and the cause instead of a generic error.
  std::optional<FailureRecord> RecentRankFailure() const;

  // The rooms of this rank's live KVSenders or KVReceivers whose Poll()
  // answer changed since the last call, each once, in the order they
  // changed (needs ManagerOptions::list_room_changes, else
  // FailedPrecondition). With thousands of requests in flight, a scheduler
  // step polls these instead of every request. A handle's first answer is
  // not a change: poll a new handle once. A room whose handle was replaced
  // may be listed for its new handle without a change; poll it and see.
  Result<std::vector<uint64_t>> TakeChangedRooms();

 private:
  friend class internal::ManagerAccess;
  friend Result<std::unique_ptr<KVManager>> internal::CreateManager(
      const ManagerOptions&, std::unique_ptr<internal::Transport>);
  explicit KVManager(std::unique_ptr<internal::ManagerImpl> impl);
  std::unique_ptr<internal::ManagerImpl> impl_;
};

}  // namespace kvbridge
