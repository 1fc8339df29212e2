// Fuzzes the HTTP/1.1 request parser (fed in pieces whose size comes from the
// first input byte, as a socket would deliver them), the response-head parser
// and the chunked-body decoder.
#include <cstdint>
#include <string_view>

#include "tools/http/parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace canopy::http;
  if (size < 1) return 0;
  size_t piece = 1 + data[0] % 64;
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);

  RequestLimits limits;
  limits.max_header_bytes = 4096;
  limits.max_body_bytes = 1 << 16;
  RequestParser parser(limits);
  std::string_view rest = in;
  int requests = 0;
  while (!rest.empty() && requests < 64) {
    size_t used = parser.Feed(rest.substr(0, std::min(piece, rest.size())));
    rest.remove_prefix(used);
    if (parser.state() == RequestParser::State::kComplete) {
      (void)parser.TakeRequest();
      parser.Reset();
      ++requests;
    } else if (parser.state() == RequestParser::State::kError) {
      break;
    } else if (used == 0) {
      break;
    }
  }
  (void)ParseResponseHead(in);
  ChunkedDecoder chunked;
  size_t body = 0;
  chunked.Feed(in, [&](std::string_view d) { body += d.size(); });
  return 0;
}
