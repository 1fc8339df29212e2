#include "tools/http/mime.h"

#include "tools/http/message.h"

namespace canopy::http {
namespace {

struct MimeEntry {
  std::string_view extension;
  std::string_view type;
};

constexpr MimeEntry kMimeTypes[] = {
    {"html", "text/html; charset=utf-8"},   {"htm", "text/html; charset=utf-8"},
    {"txt", "text/plain; charset=utf-8"},   {"css", "text/css; charset=utf-8"},
    {"csv", "text/csv; charset=utf-8"},     {"md", "text/markdown; charset=utf-8"},
    {"xml", "application/xml"},             {"js", "text/javascript; charset=utf-8"},
    {"mjs", "text/javascript; charset=utf-8"}, {"json", "application/json"},
    {"pdf", "application/pdf"},             {"zip", "application/zip"},
    {"gz", "application/gzip"},             {"tgz", "application/gzip"},
    {"tar", "application/x-tar"},           {"xz", "application/x-xz"},
    {"zst", "application/zstd"},            {"bz2", "application/x-bzip2"},
    {"wasm", "application/wasm"},           {"png", "image/png"},
    {"jpg", "image/jpeg"},                  {"jpeg", "image/jpeg"},
    {"gif", "image/gif"},                   {"svg", "image/svg+xml"},
    {"webp", "image/webp"},                 {"ico", "image/vnd.microsoft.icon"},
    {"bmp", "image/bmp"},                   {"avif", "image/avif"},
    {"mp3", "audio/mpeg"},                  {"ogg", "audio/ogg"},
    {"wav", "audio/wav"},                   {"flac", "audio/flac"},
    {"mp4", "video/mp4"},                   {"webm", "video/webm"},
    {"mkv", "video/x-matroska"},            {"woff", "font/woff"},
    {"woff2", "font/woff2"},                {"ttf", "font/ttf"},
    {"otf", "font/otf"},                    {"iso", "application/x-iso9660-image"},
    {"bin", "application/octet-stream"},    {"img", "application/octet-stream"},
};

}  // namespace

std::string_view MimeTypeForPath(std::string_view path) {
  size_t slash = path.rfind('/');
  std::string_view name = slash == std::string_view::npos ? path : path.substr(slash + 1);
  size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || dot + 1 == name.size()) return "application/octet-stream";
  std::string_view ext = name.substr(dot + 1);
  for (const auto& e : kMimeTypes) {
    if (EqualsIgnoreCase(e.extension, ext)) return e.type;
  }
  return "application/octet-stream";
}

}  // namespace canopy::http
