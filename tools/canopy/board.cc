#include "tools/canopy/board.h"

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/clock.h"
#include "base/logging.h"
#include "replication/protocol.h"
#include "tools/http/url.h"

namespace canopy::board {

using nlohmann::json;
using replication::CommitReply;
using replication::CommitRequest;
using replication::ConsistencyLevel;
using replication::Edit;
using replication::ReadReply;
using replication::ReadRequest;

namespace {

constexpr int kMaxListRereads = 8;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

http::Response JsonError(int status, const std::string& message, json extra = json::object()) {
  extra["error"] = message;
  return http::Response::Json(status, Dump(extra));
}

http::Response MethodNotAllowed(const char* allow) {
  http::Response r = JsonError(405, std::string("method not allowed; allowed: ") + allow);
  r.headers.Add("Allow", allow);
  return r;
}

// HTTP status for a failed replication call (transport error or reply status).
int HttpStatusFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kAlreadyExists:
    case StatusCode::kConflict: return 409;
    case StatusCode::kTimeout: return 504;
    case StatusCode::kUnavailable:
    case StatusCode::kClosed:
    case StatusCode::kAborted:
    case StatusCode::kPermissionDenied:
    case StatusCode::kResourceExhausted: return 503;
    default: return 500;
  }
}

// Query parameters (percent-decoded); nullopt for a malformed escape.
std::optional<std::map<std::string, std::string>> ParseQuery(std::string_view query) {
  std::map<std::string, std::string> out;
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (part.empty()) continue;
    size_t eq = part.find('=');
    auto key = http::PercentDecode(part.substr(0, eq));
    auto value = http::PercentDecode(eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1));
    if (!key.ok() || !value.ok()) return std::nullopt;
    out[*key] = *value;
  }
  return out;
}

std::optional<uint64_t> ParseUint(const std::string& text) {
  uint64_t v = 0;
  if (text.empty() || text.size() > 19) return std::nullopt;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

// Splits "/a/b/c" into decoded components; nullopt on a bad escape.
std::optional<std::vector<std::string>> SplitPath(std::string_view path) {
  std::vector<std::string> parts;
  size_t pos = 0;
  while (pos < path.size()) {
    if (path[pos] == '/') {
      ++pos;
      continue;
    }
    size_t end = path.find('/', pos);
    if (end == std::string_view::npos) end = path.size();
    auto d = http::PercentDecode(path.substr(pos, end - pos));
    if (!d.ok()) return std::nullopt;
    parts.push_back(std::move(*d));
    pos = end;
  }
  return parts;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A required string field of a JSON object, 1..max bytes. On failure returns
// the error response.
std::optional<http::Response> RequireString(const json& body, const char* field, size_t max_bytes,
                                            std::string* out) {
  auto it = body.find(field);
  if (it == body.end()) return JsonError(400, std::string("missing field \"") + field + "\"");
  if (!it->is_string()) return JsonError(400, std::string("field \"") + field + "\" must be a string");
  const auto& s = it->get_ref<const std::string&>();
  if (s.empty()) return JsonError(400, std::string("field \"") + field + "\" must not be empty");
  if (s.size() > max_bytes) {
    return JsonError(413, fmt::format("field \"{}\" is {} bytes, more than the {} allowed", field, s.size(), max_bytes));
  }
  *out = s;
  return std::nullopt;
}

// Parses the body as a JSON object; on failure returns the error response.
std::optional<http::Response> ParseObject(const http::Request& request, json* out) {
  *out = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) return JsonError(400, "request body is not valid JSON");
  if (!out->is_object()) return JsonError(400, "request body must be a JSON object");
  return std::nullopt;
}

}  // namespace

std::string BoardTreeName(const std::string& board) { return "board." + board; }

bool ValidBoardName(std::string_view name, size_t max_bytes) {
  if (name.empty() || name.size() > max_bytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// What STATUS of the local node said about the cluster.
struct BoardService::View {
  Clock::time_point fetched{};
  bool valid = false;
  std::string local_id;
  std::map<std::string, std::string> uris;  // node id -> URI
  std::map<std::string, bool> alive;
  replication::Ring ring;
};

BoardService::BoardService(BoardOptions options) : options_(std::move(options)), view_(std::make_unique<View>()) {}
BoardService::~BoardService() = default;

replication::Client* BoardService::ClientFor(const std::string& uri, Status* error) {
  auto it = clients_.find(uri);
  if (it != clients_.end()) return it->second.get();
  auto c = replication::Client::Connect(uri, options_.client);
  if (!c.ok()) {
    *error = c.status();
    return nullptr;
  }
  return clients_.emplace(uri, std::move(*c)).first->second.get();
}

void BoardService::DropClient(const std::string& uri) { clients_.erase(uri); }

void BoardService::RefreshView() {
  if (view_->valid && Clock::now() - view_->fetched < options_.view_refresh) return;
  Status error;
  replication::Client* c = ClientFor(options_.node_uri, &error);
  if (c == nullptr) return;
  auto s = c->GetStatus();
  if (!s.ok()) {
    DropClient(options_.node_uri);
    return;
  }
  auto v = std::make_unique<View>();
  v->fetched = Clock::now();
  v->valid = true;
  v->local_id = s->node_id;
  v->ring = replication::Ring(replication::RingOptions{s->vnodes, s->replication_factor});
  for (const auto& n : s->nodes) {
    v->uris[n.node_id] = n.uri;
    v->alive[n.node_id] = n.alive || n.node_id == s->node_id;
    (void)v->ring.AddNode(n.node_id);
  }
  view_ = std::move(v);
}

std::string BoardService::ReadUri(const std::string& tree) {
  RefreshView();
  if (!view_->valid) return options_.node_uri;
  auto owners = view_->ring.Owners(tree);
  if (owners.empty() || std::find(owners.begin(), owners.end(), view_->local_id) != owners.end()) {
    return options_.node_uri;
  }
  for (const auto& o : owners) {
    if (view_->alive[o] && !view_->uris[o].empty()) return view_->uris[o];
  }
  return options_.node_uri;
}

std::string BoardService::WriteUri(const std::string& tree) {
  RefreshView();
  if (!view_->valid) return options_.node_uri;
  auto owners = view_->ring.Owners(tree);
  if (owners.empty() || owners[0] == view_->local_id || !view_->alive[owners[0]] || view_->uris[owners[0]].empty()) {
    return options_.node_uri;
  }
  return view_->uris[owners[0]];
}

Result<ReadReply> BoardService::Read(const std::string& tree, const std::vector<uint32_t>& path,
                                     std::string* used_uri, uint64_t version) {
  std::string uri = ReadUri(tree);
  if (used_uri != nullptr) *used_uri = uri;
  auto r = ReadFrom(uri, tree, path, version);
  // A replica holds a tree only from its first commit on: an empty (or just
  // created) tree is asked of its leader before it counts as unknown.
  if (r.ok() && r->status.code == StatusCode::kNotFound && path.empty() && WriteUri(tree) != ReadUri(tree)) {
    auto at_leader = ReadFrom(WriteUri(tree), tree, path, version);
    if (at_leader.ok()) {
      if (used_uri != nullptr) *used_uri = WriteUri(tree);
      return at_leader;
    }
  }
  return r;
}

Result<ReadReply> BoardService::ReadFrom(const std::string& uri, const std::string& tree,
                                         const std::vector<uint32_t>& path, uint64_t version) {
  // One reconnect: a pooled connection may have been closed by a restarted peer.
  for (int attempt = 0; attempt < 2; ++attempt) {
    Status error;
    replication::Client* c = ClientFor(uri, &error);
    if (c == nullptr) return error;
    ReadRequest req;
    req.tree = tree;
    req.path = path;
    req.version = version;
    auto r = c->Read(req);
    if (r.ok()) return r;
    DropClient(uri);
    if (attempt == 1) return r.status();
  }
  return Status::Internal("unreachable");
}

Result<CommitReply> BoardService::Commit(const CommitRequest& request) {
  std::string uri = WriteUri(request.tree);
  Status error;
  replication::Client* c = ClientFor(uri, &error);
  if (c == nullptr) return error;
  auto r = c->Commit(request);
  if (!r.ok()) {
    // Not retried: the request may have been committed before the connection broke.
    DropClient(uri);
    return r.status();
  }
  // After a redirect the client is connected to the leader: keep it under that URI.
  if (c->connected_uri() != uri) {
    auto moved = std::move(clients_[uri]);
    clients_.erase(uri);
    if (!clients_.count(moved->connected_uri())) clients_[moved->connected_uri()] = std::move(moved);
  }
  return r;
}

Result<replication::CreateTreeReply> BoardService::CreateTree(const std::string& tree) {
  std::string uri = WriteUri(tree);
  Status error;
  replication::Client* c = ClientFor(uri, &error);
  if (c == nullptr) return error;
  auto r = c->CreateTree(tree);
  if (!r.ok()) {
    DropClient(uri);
    return r.status();
  }
  if (c->connected_uri() != uri) {
    auto moved = std::move(clients_[uri]);
    clients_.erase(uri);
    if (!clients_.count(moved->connected_uri())) clients_[moved->connected_uri()] = std::move(moved);
  }
  return r;
}

Status BoardService::EnsureRegistry() {
  if (registry_ready_) return Status::Ok();
  CANOPY_ASSIGN_OR_RETURN(auto reply, CreateTree(kRegistryTree));
  Status s = reply.status.ToStatus();
  if (!s.ok() && s.code() != StatusCode::kAlreadyExists) return s.WithContext("creating the board registry");
  registry_ready_ = true;
  return Status::Ok();
}

http::Response BoardService::Handle(const http::Request& request) {
  auto parts = SplitPath(request.path());
  if (!parts) return JsonError(400, "malformed percent-escape in the path");
  const auto& p = *parts;
  if (p.empty() || p[0] != "boards") return JsonError(404, "no such resource; see /boards");
  if (p.size() == 1) {
    if (request.method == "GET") return ListBoards();
    if (request.method == "POST") return CreateBoard(request);
    return MethodNotAllowed("GET, POST");
  }
  if (p.size() == 3 && p[2] == "messages") {
    if (!ValidBoardName(p[1], options_.max_name_bytes)) {
      return JsonError(400, fmt::format("bad board name (1..{} characters of A-Z a-z 0-9 _ -)", options_.max_name_bytes));
    }
    if (request.method == "GET") return ListMessages(p[1], request);
    if (request.method == "POST") return PostMessage(p[1], request);
    return MethodNotAllowed("GET, POST");
  }
  return JsonError(404, "no such resource; see /boards and /boards/NAME/messages");
}

http::Response BoardService::ListBoards() {
  auto r = Read(kRegistryTree, {});
  if (!r.ok()) return JsonError(HttpStatusFor(r.status()), r.status().ToString());
  json names = json::array();
  Status s = r->status.ToStatus();
  if (s.code() != StatusCode::kNotFound) {  // NotFound: no board created yet
    if (!s.ok()) return JsonError(HttpStatusFor(s), s.ToString());
    for (const auto& [name, value] : r->attributes) names.push_back(name);
  }
  return http::Response::Json(200, Dump(json{{"boards", names}}));
}

http::Response BoardService::CreateBoard(const http::Request& request) {
  auto query = ParseQuery(request.query());
  if (!query) return JsonError(400, "malformed query string");
  ConsistencyLevel level = ConsistencyLevel::kQuorum;
  if (query->count("cl")) {
    auto l = replication::ParseConsistencyLevel((*query)["cl"]);
    if (!l.ok()) return JsonError(400, "cl must be ONE, QUORUM or ALL");
    level = *l;
  }
  json body;
  if (auto e = ParseObject(request, &body)) return std::move(*e);
  std::string name;
  if (auto e = RequireString(body, "name", options_.max_name_bytes, &name)) return std::move(*e);
  if (!ValidBoardName(name, options_.max_name_bytes)) {
    return JsonError(400, "a board name is made of A-Z a-z 0-9 _ -");
  }
  Status reg = EnsureRegistry();
  if (!reg.ok()) return JsonError(HttpStatusFor(reg), reg.ToString());
  auto created = CreateTree(BoardTreeName(name));
  if (!created.ok()) return JsonError(HttpStatusFor(created.status()), created.status().ToString());
  Status cs = created->status.ToStatus();
  bool exists = cs.code() == StatusCode::kAlreadyExists;
  if (!cs.ok() && !exists) return JsonError(HttpStatusFor(cs), cs.ToString());
  if (exists) {
    // Repair a board whose registration failed earlier; it still answers 409.
    auto r = Read(kRegistryTree, {});
    if (r.ok() && r->status.code == StatusCode::kOk && r->attributes.count(name)) {
      return JsonError(409, "board " + name + " already exists");
    }
  }
  CommitRequest reg_commit;
  reg_commit.tree = kRegistryTree;
  reg_commit.level = level;
  reg_commit.timeout_ms = options_.default_write_timeout_ms;
  reg_commit.edits.push_back(
      Edit{Edit::Kind::kPutAttribute, {}, name, Dump(json{{"created_ms", NowMs()}}), 0});
  auto committed = Commit(reg_commit);
  Status rs = committed.ok() ? committed->status.ToStatus() : committed.status();
  if (exists) return JsonError(409, "board " + name + " already exists");
  if (!rs.ok()) {
    return JsonError(HttpStatusFor(rs), "board " + name + " was created but registering it failed: " + rs.ToString());
  }
  return http::Response::Json(201, Dump(json{{"name", name}, {"leader", created->leader}, {"owners", created->owners}}));
}

http::Response BoardService::PostMessage(const std::string& board, const http::Request& request) {
  auto query = ParseQuery(request.query());
  if (!query) return JsonError(400, "malformed query string");
  ConsistencyLevel level = ConsistencyLevel::kQuorum;
  if (query->count("cl")) {
    auto l = replication::ParseConsistencyLevel((*query)["cl"]);
    if (!l.ok()) return JsonError(400, "cl must be ONE, QUORUM or ALL");
    level = *l;
  }
  uint32_t timeout_ms = options_.default_write_timeout_ms;
  if (query->count("timeout_ms")) {
    auto t = ParseUint((*query)["timeout_ms"]);
    if (!t || *t == 0 || *t > options_.max_write_timeout_ms) {
      return JsonError(400, fmt::format("timeout_ms must be 1..{}", options_.max_write_timeout_ms));
    }
    timeout_ms = static_cast<uint32_t>(*t);
  }
  json body;
  if (auto e = ParseObject(request, &body)) return std::move(*e);
  std::string author, text;
  if (auto e = RequireString(body, "author", options_.max_author_bytes, &author)) return std::move(*e);
  if (auto e = RequireString(body, "text", options_.max_text_bytes, &text)) return std::move(*e);

  CommitRequest c;
  c.tree = BoardTreeName(board);
  c.level = level;
  c.timeout_ms = timeout_ms;
  c.edits.push_back(Edit{Edit::Kind::kInsertChild, {}, "", "", 0});
  c.edits.push_back(Edit{Edit::Kind::kPutAttribute, {0}, "author", author, 0});
  c.edits.push_back(Edit{Edit::Kind::kPutAttribute, {0}, "text", text, 0});
  c.edits.push_back(Edit{Edit::Kind::kPutAttribute, {0}, "time_ms", std::to_string(NowMs()), 0});
  auto r = Commit(c);
  if (!r.ok()) return JsonError(HttpStatusFor(r.status()), r.status().ToString());
  Status s = r->status.ToStatus();
  const char* cl = replication::ConsistencyLevelName(level);
  if (s.code() == StatusCode::kNotFound) return JsonError(404, "no board " + board + ": " + s.message());
  if (s.code() == StatusCode::kTimeout) {
    return JsonError(504, fmt::format("consistency level {} not reached within {} ms: {}", cl, timeout_ms, s.message()),
                     json{{"version", r->version}, {"acks", r->acks}, {"cl", cl}, {"committed_on_leader", true}});
  }
  if (!s.ok()) return JsonError(HttpStatusFor(s), s.ToString());
  return http::Response::Json(
      201, Dump(json{{"id", r->version}, {"version", r->version}, {"acks", r->acks}, {"cl", cl}}));
}

http::Response BoardService::ListMessages(const std::string& board, const http::Request& request) {
  auto query = ParseQuery(request.query());
  if (!query) return JsonError(400, "malformed query string");
  uint64_t after = 0;
  uint64_t limit = options_.default_list_limit;
  if (query->count("after")) {
    auto a = ParseUint((*query)["after"]);
    if (!a) return JsonError(400, "after must be a message id (a non-negative integer)");
    after = *a;
  }
  if (query->count("limit")) {
    auto l = ParseUint((*query)["limit"]);
    if (!l || *l == 0 || *l > options_.max_list_limit) {
      return JsonError(400, fmt::format("limit must be 1..{}", options_.max_list_limit));
    }
    limit = *l;
  }
  uint64_t requested = 0;  // 0: the newest version
  if (query->count("version")) {
    auto v = ParseUint((*query)["version"]);
    if (!v || *v == 0) return JsonError(400, "version must be a board version (a positive integer)");
    requested = *v;
  }
  const std::string tree = BoardTreeName(board);
  // Every read of one listing goes to the same node, so versions only move forward.
  std::string uri;
  auto root = Read(tree, {}, &uri, requested);
  if (!root.ok()) return JsonError(HttpStatusFor(root.status()), root.status().ToString());
  Status s = root->status.ToStatus();
  if (s.code() == StatusCode::kNotFound && requested != 0) {
    // The board exists but that version is not held (too old, or not yet here)?
    auto newest = ReadFrom(uri, tree, {});
    if (newest.ok() && newest->status.ToStatus().ok()) return JsonError(404, "board " + board + ": " + s.ToString());
  }
  if (s.code() == StatusCode::kNotFound) return JsonError(404, "no board " + board);
  if (!s.ok()) return JsonError(HttpStatusFor(s), s.ToString());
  uint64_t version = root->version;
  uint64_t count = root->child_count;
  if (count != version) {
    return JsonError(500, fmt::format("board tree {} holds {} children at version {}: it was written outside the "
                                      "board API", tree, count, version));
  }
  json messages = json::array();
  uint64_t last = std::min<uint64_t>(count, after + limit);
  uint64_t next_after = after;
  for (uint64_t id = after + 1; id <= last; ++id) {
    // Each version prepended one message, so at version V message `id` is
    // child V - id. Every message is read at the version of the root read
    // (the node retains it; see canopy node --keep-versions), so the listing
    // is one consistent snapshot.
    std::optional<ReadReply> got;
    auto pinned = ReadFrom(uri, tree, {static_cast<uint32_t>(version - id)}, version);
    if (!pinned.ok()) return JsonError(HttpStatusFor(pinned.status()), pinned.status().ToString());
    Status ps = pinned->status.ToStatus();
    if (ps.ok()) {
      got = std::move(*pinned);
    } else if (ps.code() != StatusCode::kNotFound || requested != 0) {
      return JsonError(HttpStatusFor(ps) == 404 && requested == 0 ? 500 : HttpStatusFor(ps), ps.ToString());
    }
    // The node no longer holds that version (a retention of very few
    // versions): read the newest instead, following the tree as it moves.
    uint64_t at = version;
    for (int attempt = 0; attempt < kMaxListRereads && !got; ++attempt) {
      if (at < id) return JsonError(503, "the answering replica went back in version; retry");
      auto m = ReadFrom(uri, tree, {static_cast<uint32_t>(at - id)});
      if (!m.ok()) return JsonError(HttpStatusFor(m.status()), m.status().ToString());
      Status ms = m->status.ToStatus();
      if (!ms.ok()) return JsonError(HttpStatusFor(ms) == 404 ? 500 : HttpStatusFor(ms), ms.ToString());
      if (m->version == at) {
        got = std::move(*m);
      } else {
        at = m->version;
      }
    }
    if (!got) return JsonError(503, "board is changing too fast to list; retry");
    json msg{{"id", id}};
    msg["author"] = got->attributes["author"];
    msg["text"] = got->attributes["text"];
    auto t = ParseUint(got->attributes["time_ms"]);
    msg["time_ms"] = t.value_or(0);
    messages.push_back(std::move(msg));
    next_after = id;
  }
  return http::Response::Json(200, Dump(json{{"board", board},
                                             {"version", version},
                                             {"count", count},
                                             {"messages", messages},
                                             {"next_after", next_after}}));
}

}  // namespace canopy::board
