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
using replication::ReadLevel;
using replication::SliceReply;
using replication::SliceRequest;

namespace {

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

// Appends `s` as a JSON string literal. Bytes that are not valid UTF-8 are
// replaced by U+FFFD (as Dump does), so the output is always valid JSON.
void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      size_t j = i + 1;
      while (j < s.size()) {
        auto d = static_cast<unsigned char>(s[j]);
        if (d < 0x20 || d >= 0x80 || d == '"' || d == '\\') break;
        ++j;
      }
      out->append(s.data() + i, j - i);
      i = j;
      continue;
    }
    if (c == '"') {
      *out += "\\\"";
    } else if (c == '\\') {
      *out += "\\\\";
    } else if (c < 0x20) {
      switch (c) {
        case '\n': *out += "\\n"; break;
        case '\r': *out += "\\r"; break;
        case '\t': *out += "\\t"; break;
        case '\b': *out += "\\b"; break;
        case '\f': *out += "\\f"; break;
        default: *out += fmt::format("\\u{:04x}", c);
      }
    } else {
      // A UTF-8 sequence: copied when well formed, else U+FFFD for its first byte.
      size_t len = c >= 0xf0 ? (c < 0xf5 ? 4 : 0) : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
      bool ok = len > 0 && i + len <= s.size();
      for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
      if (ok && len == 3) {
        auto d = static_cast<unsigned char>(s[i + 1]);
        ok = !(c == 0xe0 && d < 0xa0) && !(c == 0xed && d >= 0xa0);  // overlong, surrogates
      }
      if (ok && len == 4) {
        auto d = static_cast<unsigned char>(s[i + 1]);
        ok = !(c == 0xf0 && d < 0x90) && !(c == 0xf4 && d >= 0x90);
      }
      if (ok) {
        out->append(s.data() + i, len);
        i += len;
      } else {
        *out += "\xef\xbf\xbd";
        ++i;
      }
      continue;
    }
    ++i;
  }
  out->push_back('"');
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

// What STATUS of the local node said about the cluster. Immutable once published.
struct BoardService::View {
  Clock::time_point fetched{};
  bool valid = false;
  std::string local_id;
  std::map<std::string, std::string> uris;  // node id -> URI
  std::map<std::string, bool> alive;
  replication::Ring ring;
  bool IsOwner(const std::string& tree) const {
    auto owners = ring.Owners(tree);
    return owners.empty() || std::find(owners.begin(), owners.end(), local_id) != owners.end();
  }
};

namespace {
constexpr char kListings[] = "canopy_board_listings_total";
constexpr char kListingsHelp[] =
    "Board listings answered (200): from this node's store on the HTTP thread (here), sent on to an owner "
    "from the HTTP thread (forwarded), or by a worker thread (worker).";
}  // namespace

BoardService::BoardService(BoardOptions options)
    : options_(std::move(options)),
      view_(std::make_shared<const View>()),
      listings_here_(metrics::GetCounter(kListings, kListingsHelp, {{"answered", "here"}})),
      listings_forwarded_(metrics::GetCounter(kListings, kListingsHelp, {{"answered", "forwarded"}})),
      listings_by_worker_(metrics::GetCounter(kListings, kListingsHelp, {{"answered", "worker"}})) {
  if (options_.workers > 0 && options_.forward_links_per_peer > 0) {
    replication::SliceForwarderOptions f;
    f.client = options_.client;
    f.links_per_peer = options_.forward_links_per_peer;
    f.max_in_flight = options_.forward_max_in_flight;
    f.reply_timeout = std::chrono::milliseconds(options_.read_timeout_ms) + options_.client.timeout;
    forwarder_ = std::make_unique<replication::SliceForwarder>(std::move(f));
  }
  for (size_t i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

BoardService::~BoardService() {
  std::deque<Job> left;
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    stopping_ = true;
    left.swap(jobs_);
  }
  jobs_cv_.notify_all();
  for (auto& job : left) job.responder.Respond(JsonError(503, "the node is shutting down"));
  for (auto& t : workers_) t.join();
  // Forwarded reads still out fail now; their fallback (Enqueue) answers 503.
  forwarder_.reset();
}

void BoardService::WorkerLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(jobs_mu_);
      jobs_cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job.responder.Respond(Handle(job.request));
  }
}

std::optional<http::Response> BoardService::HandleAsync(const http::Request& request, http::Responder& responder) {
  if (workers_.empty()) return Handle(request);
  if (auto now = Route(request, /*may_block=*/false, &responder)) return now;
  if (responder.empty()) return std::nullopt;  // forwarded
  Enqueue(request, std::move(responder));
  return std::nullopt;
}

void BoardService::AfterEvents() {
  if (forwarder_) forwarder_->Flush();
  if (options_.local_flush) options_.local_flush();
}

void BoardService::Enqueue(http::Request request, http::Responder responder) {
  std::unique_lock<std::mutex> lock(jobs_mu_);
  if (stopping_ || jobs_.size() >= options_.max_queued) {
    http::Response busy = stopping_ ? JsonError(503, "the node is shutting down")
                                    : JsonError(503, fmt::format("{} requests are already waiting; retry", jobs_.size()));
    busy.headers.Add("Retry-After", "1");
    lock.unlock();
    responder.Respond(std::move(busy));
    return;
  }
  jobs_.push_back(Job{std::move(request), std::move(responder)});
  jobs_cv_.notify_one();
}

http::Response BoardService::Handle(const http::Request& request) {
  return *Route(request, /*may_block=*/true, nullptr);
}

std::unique_ptr<replication::Client> BoardService::TakeClient(const std::string& uri, Status* error) {
  {
    std::lock_guard<std::mutex> lock(clients_mu_);
    auto it = idle_clients_.find(uri);
    if (it != idle_clients_.end() && !it->second.empty()) {
      auto c = std::move(it->second.back());
      it->second.pop_back();
      return c;
    }
  }
  auto c = replication::Client::Connect(uri, options_.client);
  if (!c.ok()) {
    *error = c.status();
    return nullptr;
  }
  return std::move(*c);
}

void BoardService::GiveClient(std::unique_ptr<replication::Client> client) {
  std::lock_guard<std::mutex> lock(clients_mu_);
  // After a redirect a client is connected to the leader: pool it under that URI.
  auto& idle = idle_clients_[client->connected_uri()];
  if (idle.size() < options_.workers + 1) idle.push_back(std::move(client));
}

std::shared_ptr<const BoardService::View> BoardService::CurrentView(bool may_block) {
  std::shared_ptr<const View> current;
  {
    std::lock_guard<std::mutex> lock(view_mu_);
    current = view_;
  }
  bool stale = !current->valid || Clock::now() - current->fetched >= options_.view_refresh;
  if (!stale || !may_block || refreshing_.exchange(true)) return current;
  // This thread refreshes; the others go on with the old view meanwhile.
  struct Done {
    std::atomic<bool>& flag;
    ~Done() { flag = false; }
  } done{refreshing_};
  Status error;
  auto c = TakeClient(options_.node_uri, &error);
  if (!c) return current;
  auto s = c->GetStatus();
  if (!s.ok()) return current;
  GiveClient(std::move(c));
  auto v = std::make_shared<View>();
  v->fetched = Clock::now();
  v->valid = true;
  v->local_id = s->node_id;
  std::vector<std::string> ids;
  for (const auto& n : s->nodes) {
    v->uris[n.node_id] = n.uri;
    v->alive[n.node_id] = n.alive || n.node_id == s->node_id;
    ids.push_back(n.node_id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const replication::RingOptions ring_options{s->vnodes, s->replication_factor};
  const replication::RingOptions& old_options = current->ring.options();
  if (current->valid && old_options.vnodes_per_node == ring_options.vnodes_per_node &&
      old_options.replication_factor == ring_options.replication_factor && current->ring.nodes() == ids) {
    v->ring = current->ring;  // the same members: no need to place 256 tokens per node again
  } else {
    v->ring = replication::Ring(ring_options);
    (void)v->ring.AddNodes(ids);
  }
  std::lock_guard<std::mutex> lock(view_mu_);
  view_ = v;
  return v;
}

bool BoardService::RoutableFromEventThread(const View& view) const {
  if (!view.valid) return false;
  const auto age = Clock::now() - view.fetched;
  return age < options_.view_refresh || (age < 2 * options_.view_refresh && refreshing_.load());
}

std::string BoardService::ReadUri(const View& view, const std::string& tree) const {
  if (!view.valid || view.IsOwner(tree)) return options_.node_uri;
  for (const auto& o : view.ring.Owners(tree)) {
    auto alive = view.alive.find(o);
    auto uri = view.uris.find(o);
    if (alive != view.alive.end() && alive->second && uri != view.uris.end() && !uri->second.empty()) {
      return uri->second;
    }
  }
  return options_.node_uri;
}

std::string BoardService::WriteUri(const View& view, const std::string& tree) const {
  if (!view.valid) return options_.node_uri;
  auto owners = view.ring.Owners(tree);
  if (owners.empty() || owners[0] == view.local_id) return options_.node_uri;
  auto alive = view.alive.find(owners[0]);
  auto uri = view.uris.find(owners[0]);
  if (alive == view.alive.end() || !alive->second || uri == view.uris.end() || uri->second.empty()) {
    return options_.node_uri;
  }
  return uri->second;
}

Result<SliceReply> BoardService::SliceFrom(const std::string& uri, const SliceRequest& request) {
  if (uri == options_.node_uri && options_.local_slice) return options_.local_slice(request);
  // One reconnect: a pooled connection may have been closed by a restarted peer.
  for (int attempt = 0; attempt < 2; ++attempt) {
    Status error;
    auto c = TakeClient(uri, &error);
    if (!c) return error;
    auto r = c->Slice(request);
    if (r.ok()) {
      GiveClient(std::move(c));
      return r;
    }
    if (attempt == 1) return r.status();
  }
  return Status::Internal("unreachable");
}

std::optional<Result<SliceReply>> BoardService::SliceRead(const SliceRequest& request, bool may_block) {
  if (request.level != ReadLevel::kOne) {
    if (!may_block) return std::nullopt;
    auto r = SliceFrom(options_.node_uri, request);
    // In-process, the local node answers a LEADER read it does not lead with
    // the leader's URI (over the wire the client follows it by itself).
    if (r.ok() && request.level == ReadLevel::kLeader && r->status.code == StatusCode::kUnavailable &&
        !r->leader.empty() && r->leader != options_.node_uri) {
      return SliceFrom(r->leader, request);
    }
    return r;
  }
  auto view = CurrentView(may_block);
  if (!may_block) {
    // The fast path: this node's own store, when it owns the tree.
    // A view too old to route by (RoutableFromEventThread) sends the request
    // to a worker, which refreshes it.
    if (!options_.local_slice || !RoutableFromEventThread(*view) || !view->IsOwner(request.tree)) {
      return std::nullopt;
    }
    SliceReply r = options_.local_slice(request);
    if (r.status.code != StatusCode::kOk) return std::nullopt;  // the worker sorts it out
    return Result<SliceReply>(std::move(r));
  }
  std::string uri = ReadUri(*view, request.tree);
  // Later listings of this tree can then be forwarded from the event thread.
  if (forwarder_ && uri != options_.node_uri && request.version == 0) (void)forwarder_->Connect(uri);
  auto r = SliceFrom(uri, request);
  // A replica holds a tree only from its first commit on: an empty (or just
  // created) tree is asked of its leader before it counts as unknown.
  std::string leader_uri = WriteUri(*view, request.tree);
  if (r.ok() && r->status.code == StatusCode::kNotFound && request.path.empty() && leader_uri != uri) {
    auto at_leader = SliceFrom(leader_uri, request);
    if (at_leader.ok()) return at_leader;
  }
  return r;
}

Result<CommitReply> BoardService::Commit(const CommitRequest& request) {
  std::string uri = WriteUri(*CurrentView(true), request.tree);
  Status error;
  auto c = TakeClient(uri, &error);
  if (!c) return error;
  auto r = c->Commit(request);
  // Not retried on a transport error: the request may have been committed
  // before the connection broke. The broken client is dropped.
  if (r.ok()) GiveClient(std::move(c));
  return r;
}

Result<replication::CreateTreeReply> BoardService::CreateTree(const std::string& tree) {
  std::string uri = WriteUri(*CurrentView(true), tree);
  Status error;
  auto c = TakeClient(uri, &error);
  if (!c) return error;
  auto r = c->CreateTree(tree);
  if (r.ok()) GiveClient(std::move(c));
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

std::optional<http::Response> BoardService::Route(const http::Request& request, bool may_block,
                                                  http::Responder* responder) {
  auto parts = SplitPath(request.path());
  if (!parts) return JsonError(400, "malformed percent-escape in the path");
  const auto& p = *parts;
  if (p.empty() || p[0] != "boards") return JsonError(404, "no such resource; see /boards");
  if (p.size() == 1) {
    if (request.method == "GET") return ListBoards(request, may_block);
    if (request.method == "POST") {
      if (!may_block) return std::nullopt;
      return CreateBoard(request);
    }
    return MethodNotAllowed("GET, POST");
  }
  if (p.size() == 3 && p[2] == "messages") {
    if (!ValidBoardName(p[1], options_.max_name_bytes)) {
      return JsonError(400, fmt::format("bad board name (1..{} characters of A-Z a-z 0-9 _ -)", options_.max_name_bytes));
    }
    if (request.method == "GET") return ListMessages(p[1], request, may_block, responder);
    if (request.method == "POST") {
      if (!may_block) return std::nullopt;
      return PostMessage(p[1], request);
    }
    return MethodNotAllowed("GET, POST");
  }
  return JsonError(404, "no such resource; see /boards and /boards/NAME/messages");
}

namespace {

// The read level of a GET from its cl parameter (default ONE); the error response otherwise.
std::optional<http::Response> ReadLevelParam(std::map<std::string, std::string>& query, ReadLevel* level) {
  *level = ReadLevel::kOne;
  if (!query.count("cl")) return std::nullopt;
  auto l = replication::ParseReadLevel(query["cl"]);
  if (!l.ok()) return JsonError(400, "cl of a read must be ONE, LEADER or QUORUM");
  *level = *l;
  return std::nullopt;
}

}  // namespace

std::optional<http::Response> BoardService::ListBoards(const http::Request& request, bool may_block) {
  auto query = ParseQuery(request.query());
  if (!query) return JsonError(400, "malformed query string");
  SliceRequest req;
  req.tree = kRegistryTree;
  req.timeout_ms = options_.read_timeout_ms;
  if (auto e = ReadLevelParam(*query, &req.level)) return e;
  auto r = SliceRead(req, may_block);
  if (!r) return std::nullopt;
  if (!r->ok()) return JsonError(HttpStatusFor(r->status()), r->status().ToString());
  json names = json::array();
  Status s = (*r)->status.ToStatus();
  if (s.code() != StatusCode::kNotFound) {  // NotFound: no board created yet
    if (!s.ok()) return JsonError(HttpStatusFor(s), s.ToString());
    for (const auto& [name, value] : (*r)->attributes) names.push_back(name);
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
    SliceRequest req;
    req.tree = kRegistryTree;
    auto r = *SliceRead(req, /*may_block=*/true);
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

std::variant<BoardService::Listing, http::Response> BoardService::ParseListing(const std::string& board,
                                                                              const http::Request& request) const {
  auto query = ParseQuery(request.query());
  if (!query) return JsonError(400, "malformed query string");
  Listing listing;
  uint64_t limit = options_.default_list_limit;
  if (query->count("after")) {
    auto a = ParseUint((*query)["after"]);
    if (!a || *a > UINT32_MAX) return JsonError(400, "after must be a message id (a non-negative integer)");
    listing.after = *a;
  }
  if (query->count("limit")) {
    auto l = ParseUint((*query)["limit"]);
    if (!l || *l == 0 || *l > options_.max_list_limit) {
      return JsonError(400, fmt::format("limit must be 1..{}", options_.max_list_limit));
    }
    limit = *l;
  }
  SliceRequest& req = listing.slice;
  req.tree = BoardTreeName(board);
  req.timeout_ms = options_.read_timeout_ms;
  if (auto e = ReadLevelParam(*query, &req.level)) return std::move(*e);
  if (query->count("version")) {
    auto v = ParseUint((*query)["version"]);
    if (!v || *v == 0) return JsonError(400, "version must be a board version (a positive integer)");
    if (req.level != ReadLevel::kOne) return JsonError(400, "version=V is read at cl=ONE only");
    req.version = *v;
  }
  // At version V message `id` is child V - id: messages after+1 .. after+limit
  // are the children [V - after - limit, V - after), counted from the end.
  req.child_from = static_cast<uint32_t>(listing.after);
  req.child_limit = static_cast<uint32_t>(limit);
  req.from_end = true;
  return listing;
}

// A forwarded listing waiting for its SLICE reply (see board.h): answers an
// OK reply itself and gives anything else to the workers.
class BoardService::ForwardedListing : public replication::SliceForwarder::Waiter {
 public:
  ForwardedListing(BoardService* service, std::string board, Listing listing, const http::Request& request,
                   http::Responder responder)
      : service_(service), board_(std::move(board)), listing_(std::move(listing)), request_(request),
        responder_(std::move(responder)) {}

  void Done(Result<SliceReply> reply) override {
    if (reply.ok() && reply->status.code == StatusCode::kOk) {
      http::Response response = service_->RenderListing(board_, listing_, *reply);
      if (response.status == 200) service_->listings_forwarded_.Increment();
      responder_.Respond(std::move(response));
      return;
    }
    service_->Enqueue(std::move(request_), std::move(responder_));
  }

  http::Responder TakeResponder() { return std::move(responder_); }

 private:
  BoardService* const service_;
  const std::string board_;
  const Listing listing_;
  http::Request request_;
  http::Responder responder_;
};

bool BoardService::TryForwardListing(const std::string& board, const Listing& listing, const http::Request& request,
                                     http::Responder* responder) {
  if (responder == nullptr || workers_.empty()) return false;
  if (listing.slice.level == ReadLevel::kQuorum && options_.local_slice_async) {
    auto pending = std::make_shared<ForwardedListing>(this, board, listing, request, std::move(*responder));
    bool started = options_.local_slice_async(listing.slice, [pending](std::optional<SliceReply> reply) {
      if (reply) {
        pending->Done(std::move(*reply));
      } else {
        pending->Done(Status::Unavailable("left to a worker"));
      }
    });
    if (started) return true;
    *responder = pending->TakeResponder();
    return false;
  }
  if (!forwarder_ || listing.slice.level != ReadLevel::kOne || listing.slice.version != 0) return false;
  auto view = CurrentView(/*may_block=*/false);
  if (!RoutableFromEventThread(*view) || view->IsOwner(listing.slice.tree)) {
    return false;
  }
  const std::string uri = ReadUri(*view, listing.slice.tree);
  if (uri == options_.node_uri) return false;
  auto waiter = std::make_unique<ForwardedListing>(this, board, listing, request, std::move(*responder));
  ForwardedListing* forwarded = waiter.get();
  std::unique_ptr<replication::SliceForwarder::Waiter> base = std::move(waiter);
  if (forwarder_->TrySend(uri, listing.slice, base)) return true;
  *responder = forwarded->TakeResponder();  // not sent: `base` still owns it
  return false;
}

std::optional<http::Response> BoardService::ListMessages(const std::string& board, const http::Request& request,
                                                         bool may_block, http::Responder* responder) {
  auto parsed = ParseListing(board, request);
  if (auto* error = std::get_if<http::Response>(&parsed)) return std::move(*error);
  const Listing& listing = std::get<Listing>(parsed);
  const SliceRequest& req = listing.slice;
  if (!may_block && TryForwardListing(board, listing, request, responder)) return std::nullopt;
  auto read = SliceRead(req, may_block);
  if (!read) return std::nullopt;
  if (!read->ok()) return JsonError(HttpStatusFor(read->status()), read->status().ToString());
  const SliceReply& r = **read;
  Status s = r.status.ToStatus();
  if (s.code() == StatusCode::kNotFound && req.version != 0) {
    // The board exists but that version is not held (too old, or not yet here)?
    SliceRequest newest = req;
    newest.version = 0;
    newest.child_limit = 0;
    auto n = SliceRead(newest, may_block);
    if (!n) return std::nullopt;
    if (n->ok() && (*n)->status.ToStatus().ok()) return JsonError(404, "board " + board + ": " + s.ToString());
  }
  if (s.code() == StatusCode::kNotFound) return JsonError(404, "no board " + board);
  if (!s.ok()) return JsonError(HttpStatusFor(s), s.ToString());
  http::Response response = RenderListing(board, listing, r);
  if (response.status == 200) (may_block ? listings_by_worker_ : listings_here_).Increment();
  return response;
}

http::Response BoardService::RenderListing(const std::string& board, const Listing& listing,
                                           const SliceReply& r) const {
  const uint64_t version = r.version;
  const uint64_t count = r.child_count;
  if (count != version) {
    return JsonError(500, fmt::format("board tree {} holds {} children at version {}: it was written outside the "
                                      "board API", listing.slice.tree, count, version));
  }
  // Children come newest first (index 0 = message `version`): list oldest
  // first. Rendered by hand: this is the board's hot path (no JSON tree).
  std::string out;
  out.reserve(128 + r.children.size() * 192);
  out += "{\"board\":";
  AppendJsonString(&out, board);
  out += ",\"cl\":\"";
  out += replication::ReadLevelName(listing.slice.level);
  out += "\",\"count\":";
  out += std::to_string(count);
  out += ",\"messages\":[";
  uint64_t next_after = listing.after;
  static const std::string kEmpty;
  for (size_t k = r.children.size(); k-- > 0;) {
    const auto& attributes = r.children[k].attributes;
    auto get = [&](const char* key) -> const std::string& {
      auto it = attributes.find(key);
      return it == attributes.end() ? kEmpty : it->second;
    };
    uint64_t id = version - (r.child_start + k);
    if (k + 1 != r.children.size()) out += ',';
    out += "{\"author\":";
    AppendJsonString(&out, get("author"));
    out += ",\"id\":";
    out += std::to_string(id);
    out += ",\"text\":";
    AppendJsonString(&out, get("text"));
    out += ",\"time_ms\":";
    out += std::to_string(ParseUint(get("time_ms")).value_or(0));
    out += '}';
    next_after = id;
  }
  out += "],\"next_after\":";
  out += std::to_string(next_after);
  out += ",\"version\":";
  out += std::to_string(version);
  out += '}';
  return http::Response::Json(200, std::move(out));
}

}  // namespace canopy::board
