// Safetensors reader, writer and checkpoint-directory helper; see include/moekit/io/safetensors.h.
#include "moekit/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <memory>
#include <set>
#include <system_error>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "moekit/core/error.h"
#include "moekit/io/json.h"

namespace moekit::io {
namespace {

using json = nlohmann::json;

struct DtypeBits {
  std::string_view name;
  std::size_t bits;
};

constexpr std::array<DtypeBits, 20> kDtypes{{
    {"BOOL", 8},    {"U8", 8},   {"I8", 8},   {"F8_E4M3", 8}, {"F8_E5M2", 8},
    {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16},    {"BF16", 16},
    {"I32", 32},    {"U32", 32}, {"F32", 32}, {"I64", 64},    {"U64", 64},
    {"F64", 64},    {"C64", 64}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6},
}};

constexpr uint64_t kPrefixBytes = 8;
constexpr std::size_t kMaxShownChars = 96;  // longer names/values are cut in error messages
constexpr std::size_t kMaxShownDims = 8;

std::string known_dtypes() {
  std::string out;
  for (const auto& d : kDtypes) {
    if (!out.empty()) out += ' ';
    out += d.name;
  }
  return out;
}

std::string clip(std::string_view s, std::size_t max_chars = kMaxShownChars) {
  if (s.size() <= max_chars) return std::string(s);
  return std::string(s.substr(0, max_chars)) + "...(" + std::to_string(s.size()) + " bytes)";
}

std::string squote(std::string_view name) {
  return "'" + clip(name) + "'";
}

std::string describe(const json& v) {
  return describe_json(v);
}

std::string format_shape(std::span<const int64_t> shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i == kMaxShownDims) {
      out += ", ... (" + std::to_string(shape.size()) + " dims)";
      break;
    }
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::string format_range(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// numel * bits / 8, or an error fragment ("shape [..] ...") when it is not representable.
struct SizeResult {
  uint64_t nbytes = 0;
  std::string error;
};

SizeResult compute_nbytes(std::string_view dtype, std::size_t bits,
                          std::span<const int64_t> shape) {
  uint64_t numel = 1;
  bool zero = false;
  for (int64_t d : shape) {
    if (d < 0)
      return {0, "shape " + format_shape(shape) + " has a negative dim " + std::to_string(d)};
    if (d == 0) zero = true;
  }
  // NOTE: the non-zero dims must multiply within int64 even when another dim is 0, so that any
  // running product over the shape (TensorInfo::numel, strides) stays defined.
  for (int64_t d : shape) {
    if (d == 0) continue;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return {0, "shape " + format_shape(shape) + " has more than 2^63-1 elements"};
    }
  }
  if (zero) return {0, {}};
  uint64_t total_bits = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(bits), &total_bits)) {
    return {0, "shape " + format_shape(shape) + " of dtype " + std::string(dtype) +
                   " overflows a 64-bit byte count"};
  }
  if (total_bits % 8 != 0) {
    return {0, "shape " + format_shape(shape) + " of dtype " + std::string(dtype) + " (" +
                   std::to_string(bits) + " bits each) does not fill whole bytes"};
  }
  return {total_bits / 8, {}};
}

// A JSON integer >= 0, or nullopt (negative, fractional, too large, not a number).
std::optional<uint64_t> as_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0)
    return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

bool valid_utf8(const std::string& s) {
  try {
    (void)json(s).dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

// Closes a POSIX file descriptor on scope exit.
struct FdCloser {
  int fd = -1;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

[[noreturn]] void fail(const std::filesystem::path& file, const std::string& what) {
  throw SafetensorsError(file.string() + ": " + what);
}

// Parses the header; rejects duplicate keys in any object (nlohmann would silently keep the last).
json parse_header(const std::filesystem::path& file, const char* first, const char* last) {
  try {
    return parse_json(std::string_view(first, static_cast<std::size_t>(last - first)),
                      file.string() + ": header");
  } catch (const Error& e) {
    throw SafetensorsError(e.what());
  }
}

}  // namespace

// ---- dtypes ------------------------------------------------------------------------------------

std::optional<std::size_t> dtype_bits(std::string_view dtype) {
  for (const auto& d : kDtypes) {
    if (d.name == dtype) return d.bits;
  }
  return std::nullopt;
}

std::size_t itemsize(std::string_view dtype) {
  const auto bits = dtype_bits(dtype);
  if (!bits) {
    throw SafetensorsError("unknown safetensors dtype \"" + clip(dtype) +
                           "\" (known: " + known_dtypes() + ")");
  }
  if (*bits % 8 != 0) {
    throw SafetensorsError("dtype " + std::string(dtype) + " has " + std::to_string(*bits) +
                           " bits per element, not a whole number of bytes; use tensor_nbytes");
  }
  return *bits / 8;
}

uint64_t tensor_nbytes(std::string_view dtype, std::span<const int64_t> shape) {
  const auto bits = dtype_bits(dtype);
  if (!bits) {
    throw SafetensorsError("unknown safetensors dtype \"" + clip(dtype) +
                           "\" (known: " + known_dtypes() + ")");
  }
  SizeResult r = compute_nbytes(dtype, *bits, shape);
  if (!r.error.empty()) throw SafetensorsError(r.error);
  return r.nbytes;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;  // validated on open: cannot overflow
  return n;
}

namespace {

// Little-endian element i of width W bytes (the bytes may be unaligned).
template <std::size_t W>
uint64_t element_bits(std::span<const std::byte> bytes, std::size_t i) {
  uint64_t v = 0;
  for (std::size_t b = 0; b < W; ++b)
    v |= static_cast<uint64_t>(std::to_integer<uint8_t>(bytes[i * W + b])) << (8 * b);
  return v;
}

// The first element whose bits satisfy `bad`, or nullopt.
template <std::size_t W, typename Bad>
std::optional<int64_t> first_bad(std::span<const std::byte> bytes, Bad bad) {
  const std::size_t n = bytes.size() / W;
  for (std::size_t i = 0; i < n; ++i) {
    if (bad(element_bits<W>(bytes, i))) return static_cast<int64_t>(i);
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> first_non_finite(const TensorInfo& t) {
  const std::string& d = t.dtype;
  const auto exp_all_ones = [](int shift, uint64_t mask) {
    return [shift, mask](uint64_t v) { return ((v >> shift) & mask) == mask; };
  };
  if (d == "F64") return first_bad<8>(t.bytes, exp_all_ones(52, 0x7ff));
  if (d == "F32") return first_bad<4>(t.bytes, exp_all_ones(23, 0xff));
  if (d == "C64") {  // (real, imaginary) f32 pairs: element = pair
    const auto i = first_bad<4>(t.bytes, exp_all_ones(23, 0xff));
    return i ? std::optional<int64_t>(*i / 2) : std::nullopt;
  }
  if (d == "F16") return first_bad<2>(t.bytes, exp_all_ones(10, 0x1f));
  if (d == "BF16") return first_bad<2>(t.bytes, exp_all_ones(7, 0xff));
  if (d == "F8_E4M3") return first_bad<1>(t.bytes, [](uint64_t v) { return (v & 0x7f) == 0x7f; });
  if (d == "F8_E5M2") return first_bad<1>(t.bytes, exp_all_ones(2, 0x1f));
  if (d == "F8_E8M0") return first_bad<1>(t.bytes, [](uint64_t v) { return v == 0xff; });
  return std::nullopt;
}

// ---- MappedFile --------------------------------------------------------------------------------

MappedFile MappedFile::open(const std::filesystem::path& path) {
  FdCloser fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) {
    fail(path, "cannot open: " + std::system_category().message(errno));
  }
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) {
    fail(path, "cannot stat: " + std::system_category().message(errno));
  }
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  MappedFile out;
  if (st.st_size == 0) return out;
  void* p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (p == MAP_FAILED) {
    fail(path, "cannot mmap " + std::to_string(st.st_size) +
                   " bytes: " + std::system_category().message(errno));
  }
  out.data_ = static_cast<const std::byte*>(p);
  out.size_ = static_cast<std::size_t>(st.st_size);
  return out;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  reset();
}

void MappedFile::reset() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

// ---- SafetensorsFile ---------------------------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  return open(path, Options{});
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path, Options options) {
  SafetensorsFile f;
  f.path_ = path;
  f.map_ = MappedFile::open(path);
  const std::span<const std::byte> file = f.map_.bytes();

  // 1. The length prefix.
  if (file.size() < kPrefixBytes) {
    fail(path, "file is " + std::to_string(file.size()) +
                   " bytes, shorter than the 8-byte header-length prefix");
  }
  uint64_t n = 0;
  for (std::size_t i = 0; i < kPrefixBytes; ++i) {
    n |= static_cast<uint64_t>(std::to_integer<uint8_t>(file[i])) << (8 * i);
  }
  if (n > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(n) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes");
  }
  const uint64_t after_prefix = file.size() - kPrefixBytes;
  if (n > after_prefix) {
    fail(path, "header length " + std::to_string(n) + " exceeds the " +
                   std::to_string(after_prefix) + " bytes after the 8-byte prefix");
  }
  const std::span<const std::byte> data = file.subspan(kPrefixBytes + n);

  // 2. The JSON header.
  const auto* header_begin = reinterpret_cast<const char*>(file.data() + kPrefixBytes);
  const json header = parse_header(path, header_begin, header_begin + n);
  if (!header.is_object()) fail(path, "header must be a JSON object, got " + describe(header));

  // 3. Each entry.
  struct Extent {
    uint64_t begin;
    uint64_t end;
    const std::string* name;
  };
  std::vector<Extent> extents;
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") {
      if (entry.is_null()) continue;
      if (!entry.is_object()) {
        fail(path, "'__metadata__' must be an object of strings, got " + describe(entry));
      }
      for (const auto& [mk, mv] : entry.items()) {
        if (!mv.is_string()) {
          fail(path,
               "'__metadata__' entry " + squote(mk) + " must be a string, got " + describe(mv));
        }
        f.metadata_.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    // The writer refuses empty names; so does the reader (a round trip must be possible).
    if (key.empty()) fail(path, "a tensor has an empty name");
    const std::string t = "tensor " + squote(key);
    if (!entry.is_object()) {
      fail(path,
           t + " must be an object with dtype, shape and data_offsets, got " + describe(entry));
    }
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!entry.contains(field)) fail(path, t + " is missing '" + field + "'");
    }

    const json& jdtype = entry.at("dtype");
    if (!jdtype.is_string()) fail(path, t + " dtype must be a string, got " + describe(jdtype));
    const std::string dtype = jdtype.get<std::string>();
    const auto bits = dtype_bits(dtype);
    if (!bits) {
      fail(path, t + " has unknown dtype " + describe(jdtype) + " (known: " + known_dtypes() + ")");
    }

    const json& jshape = entry.at("shape");
    if (!jshape.is_array()) {
      fail(path, t + " shape must be an array of non-negative integers, got " + describe(jshape));
    }
    std::vector<int64_t> shape;
    shape.reserve(jshape.size());
    for (std::size_t i = 0; i < jshape.size(); ++i) {
      const auto d = as_u64(jshape[i]);
      if (!d || *d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(path, t + " shape[" + std::to_string(i) + "] = " + describe(jshape[i]) +
                       " must be a non-negative integer below 2^63");
      }
      shape.push_back(static_cast<int64_t>(*d));
    }
    const SizeResult size = compute_nbytes(dtype, *bits, shape);
    if (!size.error.empty()) fail(path, t + " " + size.error);

    const json& joff = entry.at("data_offsets");
    std::optional<uint64_t> begin, end;
    if (joff.is_array() && joff.size() == 2) {
      begin = as_u64(joff[0]);
      end = as_u64(joff[1]);
    }
    if (!begin || !end) {
      fail(path, t + " data_offsets must be [begin, end] with non-negative integers, got " +
                     (joff.is_array() && joff.size() == 2
                          ? "[" + describe(joff[0]) + ", " + describe(joff[1]) + "]"
                          : describe(joff)));
    }
    const std::string range = format_range(*begin, *end);
    if (*begin > *end) fail(path, t + " data_offsets " + range + " must satisfy begin <= end");
    if (*end > data.size()) {
      fail(path, t + " data_offsets " + range + " exceed the data buffer of " +
                     std::to_string(data.size()) + " bytes");
    }
    if (*end - *begin != size.nbytes) {
      fail(path, t + " data_offsets " + range + " span " + std::to_string(*end - *begin) +
                     " bytes but dtype " + dtype + " shape " + format_shape(shape) + " needs " +
                     std::to_string(size.nbytes));
    }

    TensorInfo info{
        dtype, std::move(shape),
        data.subspan(static_cast<std::size_t>(*begin), static_cast<std::size_t>(*end - *begin))};
    auto it = f.tensors_.emplace(key, std::move(info)).first;
    if (*end > *begin) extents.push_back({*begin, *end, &it->first});
  }

  // 4. Overlaps and (unless allowed) holes between the non-empty tensors.
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t cursor = 0;
  const Extent* prev = nullptr;
  for (const Extent& e : extents) {
    if (e.begin < cursor) {
      fail(path, "tensors " + squote(*prev->name) + " data_offsets " +
                     format_range(prev->begin, prev->end) + " and " + squote(*e.name) + " " +
                     format_range(e.begin, e.end) + " overlap");
    }
    if (e.begin > cursor && !options.allow_holes) {
      fail(path, "tensor " + squote(*e.name) + " data_offsets " + format_range(e.begin, e.end) +
                     " leave a hole of " + std::to_string(e.begin - cursor) + " bytes at offset " +
                     std::to_string(cursor) +
                     " (data must be contiguous; open with allow_holes to accept)");
    }
    cursor = e.end;
    prev = &e;
  }
  if (cursor != data.size() && !options.allow_holes) {
    fail(path, "data buffer of " + std::to_string(data.size()) + " bytes has " +
                   std::to_string(data.size() - cursor) + " bytes after the last tensor ends at " +
                   std::to_string(cursor) + " (open with allow_holes to accept)");
  }
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_)
    out.push_back(name);
  return out;
}

bool SafetensorsFile::contains(std::string_view name) const {
  return tensors_.find(name) != tensors_.end();
}

const TensorInfo& SafetensorsFile::info(std::string_view name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    fail(path_, "tensor " + squote(name) + " not found (" + std::to_string(tensors_.size()) +
                    " tensors in this file)");
  }
  return it->second;
}

// ---- SafetensorsWriter -------------------------------------------------------------------------

void SafetensorsWriter::add(std::string name, std::string dtype, std::vector<int64_t> shape,
                            std::span<const std::byte> data) {
  const std::string t = "SafetensorsWriter::add: tensor " + squote(name);
  if (name.empty()) throw SafetensorsError("SafetensorsWriter::add: tensor name is empty");
  if (name == "__metadata__") throw SafetensorsError(t + " is a reserved name");
  if (!valid_utf8(name)) throw SafetensorsError(t + " is not valid UTF-8");
  if (index_.contains(name)) throw SafetensorsError(t + " was already added");
  const auto bits = dtype_bits(dtype);
  if (!bits) {
    throw SafetensorsError(t + " has unknown dtype \"" + clip(dtype) +
                           "\" (known: " + known_dtypes() + ")");
  }
  const SizeResult size = compute_nbytes(dtype, *bits, shape);
  if (!size.error.empty()) throw SafetensorsError(t + " " + size.error);
  if (data.size() != size.nbytes) {
    throw SafetensorsError(t + " has " + std::to_string(data.size()) + " bytes of data but dtype " +
                           dtype + " shape " + format_shape(shape) + " needs " +
                           std::to_string(size.nbytes));
  }
  index_.emplace(name, entries_.size());
  entries_.push_back(
      {std::move(name), std::move(dtype), std::move(shape), {data.begin(), data.end()}});
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  if (!valid_utf8(key) || !valid_utf8(value)) {
    throw SafetensorsError("SafetensorsWriter::set_metadata: key " + squote(key) +
                           " or its value is not valid UTF-8");
  }
  metadata_[std::move(key)] = std::move(value);
}

std::string SafetensorsWriter::header() const {
  json h = json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    const uint64_t end = offset + e.data.size();
    h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string s = h.dump();
  s.resize((s.size() + 7) / 8 * 8, ' ');
  return s;
}

std::vector<std::byte> SafetensorsWriter::serialize() const {
  const std::string h = header();
  std::size_t total = kPrefixBytes + h.size();
  for (const Entry& e : entries_)
    total += e.data.size();
  std::vector<std::byte> out;
  out.reserve(total);
  for (std::size_t i = 0; i < kPrefixBytes; ++i) {
    out.push_back(static_cast<std::byte>((static_cast<uint64_t>(h.size()) >> (8 * i)) & 0xffu));
  }
  for (char c : h)
    out.push_back(static_cast<std::byte>(c));
  for (const Entry& e : entries_)
    out.insert(out.end(), e.data.begin(), e.data.end());
  return out;
}

void SafetensorsWriter::write(const std::filesystem::path& path) const {
  const std::string h = header();
  std::filesystem::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  auto write_all = [&]() -> std::string {  // an error description, or empty on success
    std::unique_ptr<std::FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
    if (!f) return "cannot create " + tmp.string() + ": " + std::system_category().message(errno);
    std::array<unsigned char, kPrefixBytes> prefix{};
    for (std::size_t i = 0; i < kPrefixBytes; ++i) {
      prefix[i] = static_cast<unsigned char>((static_cast<uint64_t>(h.size()) >> (8 * i)) & 0xffu);
    }
    bool ok = std::fwrite(prefix.data(), 1, prefix.size(), f.get()) == prefix.size() &&
              std::fwrite(h.data(), 1, h.size(), f.get()) == h.size();
    for (const Entry& e : entries_) {
      if (!ok) break;
      if (e.data.empty()) continue;  // NOTE: data() may be null; fwrite's pointer must not be
      ok = std::fwrite(e.data.data(), 1, e.data.size(), f.get()) == e.data.size();
    }
    if (!ok || std::fflush(f.get()) != 0) {
      return "write failed: " + std::system_category().message(errno);
    }
    if (std::fclose(f.release()) != 0) {
      return "close failed: " + std::system_category().message(errno);
    }
    return {};
  };
  std::string error = write_all();
  if (error.empty()) {
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) error = "cannot rename " + tmp.string() + " to it: " + ec.message();
  }
  if (!error.empty()) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    fail(path, error);
  }
}

// ---- CheckpointDir -----------------------------------------------------------------------------

CheckpointDir CheckpointDir::open(const std::filesystem::path& dir) {
  return open(dir, SafetensorsFile::Options{});
}

CheckpointDir CheckpointDir::open(const std::filesystem::path& dir,
                                  SafetensorsFile::Options options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail(dir, "not a directory");

  std::vector<fs::path> paths;
  for (fs::directory_iterator it(dir, ec), last; !ec && it != last; it.increment(ec)) {
    std::error_code type_ec;
    if (it->path().extension() == ".safetensors" && it->is_regular_file(type_ec)) {
      paths.push_back(it->path());
    }
  }
  if (ec) fail(dir, "cannot list the directory: " + ec.message());
  if (paths.empty()) fail(dir, "no *.safetensors files in the directory");
  std::sort(paths.begin(), paths.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });

  CheckpointDir out;
  out.dir_ = dir;
  std::map<std::string, std::size_t, std::less<>> by_filename;
  std::map<std::string, std::vector<std::size_t>> duplicates;  // name -> every file holding it
  for (const fs::path& p : paths) {
    const std::size_t idx = out.files_.size();
    out.files_.push_back(SafetensorsFile::open(p, options));
    by_filename.emplace(p.filename().string(), idx);
    for (const std::string& name : out.files_.back().names()) {
      const auto [it, inserted] = out.where_.emplace(name, idx);
      if (!inserted) {
        auto& holders = duplicates[name];
        if (holders.empty()) holders.push_back(it->second);
        holders.push_back(idx);
      }
    }
  }

  const fs::path index_path = dir / kIndexName;
  if (fs::exists(index_path, ec)) {
    out.has_index_ = true;
    json index;
    try {
      index = read_json_file(index_path, kMaxHeaderBytes);
    } catch (const Error& e) {
      throw SafetensorsError(e.what());
    }
    if (!index.is_object()) fail(index_path, "must be a JSON object, got " + describe(index));
    const auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) {
      fail(index_path, "must have a 'weight_map' object, got " +
                           (wm == index.end() ? std::string("none") : describe(*wm)));
    }
    for (const auto& [name, file] : wm->items()) {
      const std::string t = "weight_map tensor " + squote(name);
      if (!file.is_string())
        fail(index_path, t + " must map to a file name, got " + describe(file));
      const auto f = by_filename.find(file.get<std::string>());
      if (f == by_filename.end()) {
        fail(index_path, t + " maps to " + describe(file) +
                             ", which is not a *.safetensors file in " + dir.string());
      }
      if (!out.files_[f->second].contains(name)) {
        fail(index_path, t + " maps to " + describe(file) + ", which has no such tensor");
      }
      out.where_[name] = f->second;
      duplicates.erase(name);
    }
  }
  if (!duplicates.empty()) {
    const auto& [name, holders] = *duplicates.begin();
    std::string files;
    for (std::size_t i : holders) {
      if (!files.empty()) files += ", ";
      files += out.files_[i].path().filename().string();
    }
    fail(dir, "tensor " + squote(name) + " is held by several files (" + files + ") and " +
                  (out.has_index_ ? std::string(kIndexName) + " does not list it"
                                  : "there is no " + std::string(kIndexName) + " to choose one"));
  }
  return out;
}

std::vector<std::string> CheckpointDir::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, idx] : where_)
    out.push_back(name);
  return out;
}

bool CheckpointDir::contains(std::string_view name) const {
  return where_.find(name) != where_.end();
}

const SafetensorsFile& CheckpointDir::file_of(std::string_view name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) {
    throw SafetensorsError("tensor " + squote(name) + " not found in checkpoint " + dir_.string() +
                           " (" + std::to_string(where_.size()) + " tensors in " +
                           std::to_string(files_.size()) + " files)");
  }
  return files_[it->second];
}

const TensorInfo& CheckpointDir::find(std::string_view name) const {
  return file_of(name).info(name);
}

}  // namespace moekit::io
