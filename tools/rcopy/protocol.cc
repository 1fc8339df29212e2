#include "tools/rcopy/protocol.h"

#include <algorithm>

#include "base/coding.h"
#include "base/crc32c.h"
#include "fmt/format.h"

namespace canopy::rcopy {
namespace {

Status CheckVersion(ByteReader& reader, std::string_view what) {
  CANOPY_ASSIGN_OR_RETURN(uint8_t version, reader.ReadFixed8());
  if (version != kProtocolVersion) {
    return Status::Corruption(std::string(what) + ": protocol version " + std::to_string(version) +
                              " not supported (this rcopy speaks version " +
                              std::to_string(kProtocolVersion) + ")");
  }
  return Status::Ok();
}

Status CheckEnd(const ByteReader& reader, std::string_view what) {
  if (!reader.empty()) {
    return Status::Corruption(std::string(what) + ": " + std::to_string(reader.remaining()) +
                              " trailing bytes");
  }
  return Status::Ok();
}

Result<ChecksumAlgorithm> ReadAlgorithm(ByteReader& reader, std::string_view what) {
  CANOPY_ASSIGN_OR_RETURN(uint8_t raw, reader.ReadFixed8());
  if (raw > static_cast<uint8_t>(ChecksumAlgorithm::kCrc32c)) {
    return Status::Corruption(std::string(what) + ": unknown checksum algorithm " + std::to_string(raw));
  }
  return static_cast<ChecksumAlgorithm>(raw);
}

Result<ResumeBase> ReadBase(ByteReader& reader, std::string_view what) {
  CANOPY_ASSIGN_OR_RETURN(uint8_t raw, reader.ReadFixed8());
  if (raw > static_cast<uint8_t>(ResumeBase::kTarget)) {
    return Status::Corruption(std::string(what) + ": unknown resume base " + std::to_string(raw));
  }
  return static_cast<ResumeBase>(raw);
}

}  // namespace

const char* ResumeBaseName(ResumeBase base) {
  switch (base) {
    case ResumeBase::kNone: return "none";
    case ResumeBase::kPartial: return "partial";
    case ResumeBase::kTarget: return "target";
  }
  return "unknown";
}

std::string PartialFileName(std::string_view file) {
  constexpr std::string_view kSuffix = ".rcopy-partial";
  if (file.size() <= 230) return "." + std::string(file) + std::string(kSuffix);
  return fmt::format(".{}~{:08x}{}", file.substr(0, 200), crc32c::Value(file), kSuffix);
}

const char* ChecksumAlgorithmName(ChecksumAlgorithm algorithm) {
  switch (algorithm) {
    case ChecksumAlgorithm::kNone: return "none";
    case ChecksumAlgorithm::kXxh3: return "xxh3-64";
    case ChecksumAlgorithm::kCrc32c: return "crc32c";
  }
  return "unknown";
}

Result<ChecksumAlgorithm> ParseChecksumAlgorithm(std::string_view name) {
  if (name == "xxh3" || name == "xxh3-64" || name == "xxh3_64") return ChecksumAlgorithm::kXxh3;
  if (name == "crc32c") return ChecksumAlgorithm::kCrc32c;
  return Status::InvalidArgument("unknown checksum '" + std::string(name) + "' (use xxh3 or crc32c)");
}

Status ResultMessage::ToStatus() const {
  if (ok()) return Status::Ok();
  return Status(code, text);
}

ResultMessage ResultMessage::FromStatus(const Status& status) {
  ResultMessage m;
  m.code = status.code();
  m.text = status.message();
  if (m.text.size() > kMaxResultTextBytes) m.text.resize(kMaxResultTextBytes);
  return m;
}

ByteRange StreamRange(uint64_t file_size, uint64_t resume_offset, uint16_t streams, uint16_t index) {
  if (resume_offset > file_size) resume_offset = file_size;
  ByteRange r = SplitRange(file_size - resume_offset, streams, index);
  r.offset += resume_offset;
  return r;
}

ByteRange SplitRange(uint64_t size, uint16_t streams, uint16_t index) {
  if (streams == 0) streams = 1;
  // 128-bit arithmetic: no overflow even for sizes near 2^64.
  using Wide = unsigned __int128;
  Wide per = (Wide(size) + streams - 1) / streams;
  per = (per + kRangeAlignment - 1) / kRangeAlignment * kRangeAlignment;
  Wide offset = std::min<Wide>(Wide(size), per * index);
  Wide length = std::min<Wide>(per, Wide(size) - offset);
  return ByteRange{static_cast<uint64_t>(offset), static_cast<uint64_t>(length)};
}

std::string EncodeOpen(const OpenRequest& open) {
  std::string out;
  PutFixed8(&out, kProtocolVersion);
  PutFixed64(&out, open.transfer_id);
  PutLengthPrefixed(&out, open.name);
  PutFixed64(&out, open.file_size);
  PutFixed32(&out, open.mode);
  PutFixed16(&out, open.streams);
  PutFixed16(&out, open.stream_index);
  PutFixed64(&out, open.range_offset);
  PutFixed64(&out, open.range_length);
  PutFixed32(&out, open.flags);
  PutFixed8(&out, static_cast<uint8_t>(open.checksum));
  PutFixed64(&out, open.resume_offset);
  PutFixed8(&out, static_cast<uint8_t>(open.resume_base));
  PutFixed64(&out, open.base_id);
  return out;
}

Result<OpenRequest> DecodeOpen(std::string_view payload) {
  ByteReader reader(payload);
  CANOPY_RETURN_IF_ERROR(CheckVersion(reader, "OPEN"));
  OpenRequest open;
  CANOPY_ASSIGN_OR_RETURN(open.transfer_id, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(std::string_view name, reader.ReadLengthPrefixed(kMaxNameBytes));
  open.name = std::string(name);
  CANOPY_ASSIGN_OR_RETURN(open.file_size, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(open.mode, reader.ReadFixed32());
  CANOPY_ASSIGN_OR_RETURN(open.streams, reader.ReadFixed16());
  CANOPY_ASSIGN_OR_RETURN(open.stream_index, reader.ReadFixed16());
  CANOPY_ASSIGN_OR_RETURN(open.range_offset, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(open.range_length, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(open.flags, reader.ReadFixed32());
  CANOPY_ASSIGN_OR_RETURN(open.checksum, ReadAlgorithm(reader, "OPEN"));
  CANOPY_ASSIGN_OR_RETURN(open.resume_offset, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(open.resume_base, ReadBase(reader, "OPEN"));
  CANOPY_ASSIGN_OR_RETURN(open.base_id, reader.ReadFixed64());
  CANOPY_RETURN_IF_ERROR(CheckEnd(reader, "OPEN"));

  if (open.mode > 07777) return Status::Corruption("OPEN: mode " + std::to_string(open.mode) + " has non-permission bits");
  if (open.streams == 0 || open.streams > kMaxStreams) {
    return Status::Corruption("OPEN: stream count " + std::to_string(open.streams) + " outside 1.." +
                              std::to_string(kMaxStreams));
  }
  if (open.stream_index >= open.streams) {
    return Status::Corruption("OPEN: stream index " + std::to_string(open.stream_index) + " >= stream count " +
                              std::to_string(open.streams));
  }
  if ((open.flags & ~kOpenKnownFlags) != 0) {
    return Status::Corruption("OPEN: unknown flags " + std::to_string(open.flags & ~kOpenKnownFlags));
  }
  if (open.verify() && open.checksum == ChecksumAlgorithm::kNone) {
    return Status::Corruption("OPEN: verify requested without a checksum algorithm");
  }
  if (open.range_offset > open.file_size || open.range_length > open.file_size - open.range_offset) {
    return Status::Corruption("OPEN: range [" + std::to_string(open.range_offset) + ", +" +
                              std::to_string(open.range_length) + ") is outside the file of " +
                              std::to_string(open.file_size) + " bytes");
  }
  if (open.resume_offset > open.file_size) {
    return Status::Corruption("OPEN: resume offset " + std::to_string(open.resume_offset) + " is past the end of " +
                              std::to_string(open.file_size) + " bytes");
  }
  if ((open.resume_offset == 0) != (open.resume_base == ResumeBase::kNone)) {
    return Status::Corruption("OPEN: resume offset " + std::to_string(open.resume_offset) + " with resume base " +
                              ResumeBaseName(open.resume_base));
  }
  if (open.resume_offset > 0 && open.sink()) return Status::Corruption("OPEN: resume with sink");
  if (open.resume_base != ResumeBase::kNone && open.base_id == 0) {
    return Status::Corruption("OPEN: a resume base without an identity");
  }
  ByteRange expected = StreamRange(open.file_size, open.resume_offset, open.streams, open.stream_index);
  if (expected.offset != open.range_offset || expected.length != open.range_length) {
    return Status::Corruption("OPEN: range of stream " + std::to_string(open.stream_index) + " is [" +
                              std::to_string(open.range_offset) + ", +" + std::to_string(open.range_length) +
                              "), expected [" + std::to_string(expected.offset) + ", +" +
                              std::to_string(expected.length) + ")");
  }
  return open;
}

std::string EncodeData(const DataHeader& data) {
  std::string out;
  PutFixed8(&out, kProtocolVersion);
  PutFixed64(&out, data.offset);
  return out;
}

Result<DataHeader> DecodeData(std::string_view payload) {
  ByteReader reader(payload);
  CANOPY_RETURN_IF_ERROR(CheckVersion(reader, "DATA"));
  DataHeader data;
  CANOPY_ASSIGN_OR_RETURN(data.offset, reader.ReadFixed64());
  CANOPY_RETURN_IF_ERROR(CheckEnd(reader, "DATA"));
  return data;
}

std::string EncodeCommit(const CommitRequest& commit) {
  std::string out;
  PutFixed8(&out, kProtocolVersion);
  PutFixed64(&out, commit.bytes);
  PutFixed8(&out, static_cast<uint8_t>(commit.checksum));
  PutFixed64(&out, commit.digest);
  PutFixed64(&out, commit.file_digest);
  return out;
}

Result<CommitRequest> DecodeCommit(std::string_view payload) {
  ByteReader reader(payload);
  CANOPY_RETURN_IF_ERROR(CheckVersion(reader, "COMMIT"));
  CommitRequest commit;
  CANOPY_ASSIGN_OR_RETURN(commit.bytes, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(commit.checksum, ReadAlgorithm(reader, "COMMIT"));
  CANOPY_ASSIGN_OR_RETURN(commit.digest, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(commit.file_digest, reader.ReadFixed64());
  CANOPY_RETURN_IF_ERROR(CheckEnd(reader, "COMMIT"));
  return commit;
}

std::string EncodeResult(const ResultMessage& result) {
  std::string out;
  PutFixed8(&out, kProtocolVersion);
  PutFixed8(&out, static_cast<uint8_t>(result.code));
  std::string_view text = result.text;
  if (text.size() > kMaxResultTextBytes) text = text.substr(0, kMaxResultTextBytes);
  PutLengthPrefixed(&out, text);
  PutFixed64(&out, result.bytes);
  PutFixed8(&out, static_cast<uint8_t>(result.checksum));
  PutFixed64(&out, result.digest);
  PutFixed64(&out, result.file_digest);
  return out;
}

Result<ResultMessage> DecodeResult(std::string_view payload) {
  ByteReader reader(payload);
  CANOPY_RETURN_IF_ERROR(CheckVersion(reader, "RESULT"));
  ResultMessage result;
  CANOPY_ASSIGN_OR_RETURN(uint8_t code, reader.ReadFixed8());
  if (code > static_cast<uint8_t>(StatusCode::kClosed)) {
    return Status::Corruption("RESULT: unknown status code " + std::to_string(code));
  }
  result.code = static_cast<StatusCode>(code);
  CANOPY_ASSIGN_OR_RETURN(std::string_view text, reader.ReadLengthPrefixed(kMaxResultTextBytes));
  result.text = std::string(text);
  CANOPY_ASSIGN_OR_RETURN(result.bytes, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(result.checksum, ReadAlgorithm(reader, "RESULT"));
  CANOPY_ASSIGN_OR_RETURN(result.digest, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(result.file_digest, reader.ReadFixed64());
  CANOPY_RETURN_IF_ERROR(CheckEnd(reader, "RESULT"));
  if (!result.ok() && result.text.empty()) result.text = "(no reason given by the server)";
  return result;
}

std::string EncodeQuery(const QueryRequest& query) {
  std::string out;
  PutFixed8(&out, kProtocolVersion);
  PutLengthPrefixed(&out, query.name);
  PutFixed8(&out, static_cast<uint8_t>(query.checksum));
  PutFixed64(&out, query.source_size);
  return out;
}

Result<QueryRequest> DecodeQuery(std::string_view payload) {
  ByteReader reader(payload);
  CANOPY_RETURN_IF_ERROR(CheckVersion(reader, "QUERY"));
  QueryRequest query;
  CANOPY_ASSIGN_OR_RETURN(std::string_view name, reader.ReadLengthPrefixed(kMaxNameBytes));
  query.name = std::string(name);
  CANOPY_ASSIGN_OR_RETURN(query.checksum, ReadAlgorithm(reader, "QUERY"));
  CANOPY_ASSIGN_OR_RETURN(query.source_size, reader.ReadFixed64());
  CANOPY_RETURN_IF_ERROR(CheckEnd(reader, "QUERY"));
  if (query.checksum == ChecksumAlgorithm::kNone) return Status::Corruption("QUERY: no checksum algorithm");
  return query;
}

std::string EncodeResumeInfo(const ResumeInfo& info) {
  std::string out;
  PutFixed8(&out, kProtocolVersion);
  PutFixed8(&out, static_cast<uint8_t>(info.base));
  PutFixed64(&out, info.size);
  PutFixed8(&out, static_cast<uint8_t>(info.checksum));
  PutFixed64(&out, info.digest);
  PutFixed64(&out, info.base_id);
  return out;
}

Result<ResumeInfo> DecodeResumeInfo(std::string_view payload) {
  ByteReader reader(payload);
  CANOPY_RETURN_IF_ERROR(CheckVersion(reader, "RESUME_INFO"));
  ResumeInfo info;
  CANOPY_ASSIGN_OR_RETURN(info.base, ReadBase(reader, "RESUME_INFO"));
  CANOPY_ASSIGN_OR_RETURN(info.size, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(info.checksum, ReadAlgorithm(reader, "RESUME_INFO"));
  CANOPY_ASSIGN_OR_RETURN(info.digest, reader.ReadFixed64());
  CANOPY_ASSIGN_OR_RETURN(info.base_id, reader.ReadFixed64());
  CANOPY_RETURN_IF_ERROR(CheckEnd(reader, "RESUME_INFO"));
  if (info.base != ResumeBase::kNone && info.base_id == 0) {
    return Status::Corruption("RESUME_INFO: a base without an identity");
  }
  return info;
}

}  // namespace canopy::rcopy
