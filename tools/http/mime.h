// Content-Type by file extension (case-insensitive), e.g. "a.HTML" →
// "text/html; charset=utf-8"; "application/octet-stream" when unknown.
// Thread safety: pure function over a constant table.
#pragma once

#include <string_view>

namespace canopy::http {

std::string_view MimeTypeForPath(std::string_view path);

}  // namespace canopy::http
