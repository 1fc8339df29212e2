#include "replication/client.h"

#include <unistd.h>

#include "transport/registry.h"

namespace canopy::replication {

Result<std::unique_ptr<Client>> Client::Connect(const std::string& uri, const ClientOptions& options) {
  std::unique_ptr<Client> c(new Client(options));
  if (c->options_.client_id.empty()) c->options_.client_id = "client-" + std::to_string(::getpid());
  CANOPY_RETURN_IF_ERROR(c->Open(uri));
  return c;
}

Status Client::Open(const std::string& uri) {
  transport::TransportOptions topts;
  topts.connect_timeout = options_.timeout;
  CANOPY_ASSIGN_OR_RETURN(auto conn, transport::Dial(uri, topts));
  HandshakeConfig hs{options_.cluster, options_.client_id, options_.secret, PeerRole::kClient, ""};
  auto id = DialerHandshake(*conn, hs, Deadline::After(options_.timeout));
  if (!id.ok()) return id.status().WithContext(uri);
  conn_ = std::move(conn);
  uri_ = uri;
  return Status::Ok();
}

Result<transport::Message> Client::Call(MessageType type, const std::string& payload, MessageType reply_type,
                                        std::chrono::milliseconds extra_wait) {
  if (!conn_) return Status::Unavailable("not connected");
  Status s = conn_->Send(static_cast<uint16_t>(type), payload);
  if (!s.ok()) {
    conn_.reset();
    return s.WithContext(uri_);
  }
  auto m = conn_->Receive(Deadline::After(options_.timeout + extra_wait));
  if (!m.ok()) {
    conn_.reset();
    return m.status().WithContext(uri_);
  }
  if (m->type != static_cast<uint16_t>(reply_type) || m->bulk_bytes != 0) {
    conn_.reset();
    return UnexpectedMessage(*m, MessageTypeName(static_cast<uint16_t>(reply_type))).WithContext(uri_);
  }
  return m;
}

Result<CreateTreeReply> Client::CreateTree(const std::string& tree) {
  for (int hop = 0; hop < 2; ++hop) {
    CANOPY_ASSIGN_OR_RETURN(auto m, Call(MessageType::kCreateTreeRequest, Encode(CreateTreeRequest{tree}),
                                         MessageType::kCreateTreeReply));
    CANOPY_ASSIGN_OR_RETURN(CreateTreeReply reply, DecodeCreateTreeReply(m.payload));
    if (hop == 0 && reply.status.code == StatusCode::kUnavailable && !reply.leader.empty() && reply.leader != uri_) {
      CANOPY_RETURN_IF_ERROR(Open(reply.leader));
      continue;
    }
    return reply;
  }
  return Status::Unavailable("redirected twice");
}

Result<CommitReply> Client::Commit(const CommitRequest& request) {
  std::string payload = Encode(request);
  for (int hop = 0; hop < 2; ++hop) {
    CANOPY_ASSIGN_OR_RETURN(auto m, Call(MessageType::kCommitRequest, payload, MessageType::kCommitReply,
                                         std::chrono::milliseconds(request.timeout_ms)));
    CANOPY_ASSIGN_OR_RETURN(CommitReply reply, DecodeCommitReply(m.payload));
    if (hop == 0 && reply.status.code == StatusCode::kUnavailable && !reply.leader.empty() && reply.leader != uri_) {
      CANOPY_RETURN_IF_ERROR(Open(reply.leader));
      continue;
    }
    return reply;
  }
  return Status::Unavailable("redirected twice");
}

Result<ReadReply> Client::Read(const ReadRequest& request) {
  CANOPY_ASSIGN_OR_RETURN(auto m, Call(MessageType::kReadRequest, Encode(request), MessageType::kReadReply));
  return DecodeReadReply(m.payload);
}

Result<SliceReply> Client::Slice(const SliceRequest& request) {
  std::string payload = Encode(request);
  auto extra = request.level == ReadLevel::kOne ? std::chrono::milliseconds(0)
                                                : std::chrono::milliseconds(request.timeout_ms);
  for (int hop = 0; hop < 2; ++hop) {
    CANOPY_ASSIGN_OR_RETURN(auto m, Call(MessageType::kSliceRequest, payload, MessageType::kSliceReply, extra));
    CANOPY_ASSIGN_OR_RETURN(SliceReply reply, DecodeSliceReply(m.payload));
    if (hop == 0 && reply.status.code == StatusCode::kUnavailable && !reply.leader.empty() && reply.leader != uri_) {
      CANOPY_RETURN_IF_ERROR(Open(reply.leader));
      continue;
    }
    return reply;
  }
  return Status::Unavailable("redirected twice");
}

Result<StatusReply> Client::GetStatus() {
  CANOPY_ASSIGN_OR_RETURN(auto m, Call(MessageType::kStatusRequest, Encode(StatusRequest{}), MessageType::kStatusReply));
  return DecodeStatusReply(m.payload);
}

}  // namespace canopy::replication
