// Safetensors checkpoints: a memory-mapped, fully validated reader, a writer, and a helper for
// sharded checkpoint directories (model-0000k-of-0000n.safetensors + model.safetensors.index.json).
//
// File layout:
//   [0, 8)       u64 little-endian N: length of the JSON header
//   [8, 8+N)     UTF-8 JSON object {"__metadata__": {str: str}, "<name>": {"dtype": "BF16",
//                "shape": [d0, d1, ..], "data_offsets": [begin, end]}, ...}
//   [8+N, EOF)   the data buffer; data_offsets are relative to its first byte
//
// NOTE: every check on untrusted input happens in SafetensorsFile::open; after it returns, every
// TensorInfo::bytes span lies inside the mapping and has exactly numel * bits / 8 bytes. Any
// failure throws SafetensorsError whose message names the file, the tensor, the offending value
// and the requirement it breaks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace moekit::io {

// Every error raised by this header: malformed files, bad writer arguments, missing tensors.
class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Header lengths above this are rejected before anything is allocated (same cap as the reference
// implementation).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Bits per element of a safetensors dtype string ("BF16" -> 16, "F4" -> 4), or nullopt when the
// dtype is unknown. Known: BOOL U8 I8 F8_E4M3 F8_E5M2 F8_E8M0 I16 U16 F16 BF16 I32 U32 F32 I64
// U64 F64 C64, and the packed sub-byte floats F4 (e2m1) F6_E2M3 F6_E3M2.
std::optional<std::size_t> dtype_bits(std::string_view dtype);

// Bytes per element. Throws SafetensorsError for an unknown dtype and for the sub-byte dtypes
// (F4, F6_*), whose size is only defined for a whole tensor: use tensor_nbytes for those.
std::size_t itemsize(std::string_view dtype);

// Bytes occupied by a tensor of this dtype and shape: numel * bits / 8. Throws SafetensorsError for
// an unknown dtype, a negative dim, a size that overflows 64 bits (the non-zero dims must multiply
// within int64 even when another dim is 0), or a sub-byte tensor whose bits do not fill whole
// bytes.
uint64_t tensor_nbytes(std::string_view dtype, std::span<const int64_t> shape);

// One tensor of an opened file. `bytes` points into the file's mapping: it stays valid while the
// SafetensorsFile (or CheckpointDir) that produced it is alive, moves included. NOTE: the bytes
// are only as aligned as the file makes them (the writer below aligns the data buffer to 8 bytes
// relative to the file start); copy or check alignment before reinterpreting them.
struct TensorInfo {
  std::string dtype;                 // safetensors dtype string, e.g. "BF16"
  std::vector<int64_t> shape;        // row-major dims; empty for a 0-dim (scalar) tensor
  std::span<const std::byte> bytes;  // (numel * bits / 8) raw little-endian bytes

  int64_t numel() const;
};

// Index of the first element of `t` that is NaN or +-Inf, or nullopt when every element is finite.
// Float dtypes are decoded by their bits: F64, F32, F16, BF16 (exponent all ones), C64 (either
// part), F8_E4M3 (codes 0x7F / 0xFF: e4m3fn has no Inf), F8_E5M2 (exponent all ones), F8_E8M0
// (0xFF); integer, BOOL and packed F4 / F6 tensors have no non-finite codes. For checks of
// untrusted weights at load time (a NaN weight otherwise makes every comparison false).
std::optional<int64_t> first_non_finite(const TensorInfo& t);

// Read-only, memory-mapped map of one file (RAII; movable, not copyable).
class MappedFile {
 public:
  static MappedFile open(const std::filesystem::path& path);  // throws SafetensorsError

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  void reset() noexcept;
  const std::byte* data_ = nullptr;  // (size_,) the mapping; null when empty
  std::size_t size_ = 0;
};

// An opened and validated .safetensors file.
class SafetensorsFile {
 public:
  struct Options {
    // By default the non-empty tensors must tile the data buffer exactly: no gaps between them
    // and no trailing bytes (as the reference writer produces). Set to accept gaps and trailing
    // bytes; overlaps are always rejected.
    bool allow_holes = false;
  };

  // Maps `path` and validates its header (see the file comment; tensor names must also be
  // non-empty, as the writer requires). Throws SafetensorsError.
  static SafetensorsFile open(const std::filesystem::path& path);
  static SafetensorsFile open(const std::filesystem::path& path, Options options);

  const std::filesystem::path& path() const { return path_; }
  // Tensor names in sorted (byte-wise) order; the header's key order is not kept.
  std::vector<std::string> names() const;
  std::size_t size() const { return tensors_.size(); }
  bool contains(std::string_view name) const;
  // Throws SafetensorsError naming the file when `name` is absent.
  const TensorInfo& info(std::string_view name) const;
  // The whole mapped file: 8-byte prefix, header, data buffer. Every TensorInfo::bytes lies in it.
  std::span<const std::byte> file_bytes() const { return map_.bytes(); }
  // The "__metadata__" string map; empty when the header has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::filesystem::path path_;
  MappedFile map_;
  std::map<std::string, TensorInfo, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Builds a .safetensors file in memory and writes it in one go. Tensors are laid out contiguously
// in insertion order; the header is padded with spaces to a multiple of 8 bytes, so the data
// buffer starts 8-byte aligned.
class SafetensorsWriter {
 public:
  // Copies `data`. Throws SafetensorsError when the name is empty, "__metadata__", not valid UTF-8
  // or already added; the dtype is unknown; a dim is negative; or data.size() differs from
  // tensor_nbytes(dtype, shape).
  void add(std::string name, std::string dtype, std::vector<int64_t> shape,
           std::span<const std::byte> data);
  // Sets (or replaces) one "__metadata__" entry. Throws if either string is not valid UTF-8.
  void set_metadata(std::string key, std::string value);
  // Writes to `path` through a temporary file in the same directory renamed over `path`, so a
  // failed write never leaves a truncated checkpoint behind. Throws SafetensorsError.
  void write(const std::filesystem::path& path) const;
  // The complete file contents write() would produce.
  std::vector<std::byte> serialize() const;

  std::size_t size() const { return entries_.size(); }

 private:
  std::string header() const;  // the JSON header, space-padded to a multiple of 8 bytes

  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> data;
  };
  std::vector<Entry> entries_;  // insertion order = data layout order
  std::map<std::string, std::size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// Every *.safetensors file of one directory (not recursive), opened together. When
// model.safetensors.index.json is present, its "weight_map" (tensor name -> file name) is checked
// against the files: every listed file must be present and hold the tensor, and it decides which
// file serves a tensor that several files hold. Without an index such duplicates are an error.
// Tensors a file holds but the index does not list are still served (from their only file).
class CheckpointDir {
 public:
  static constexpr std::string_view kIndexName = "model.safetensors.index.json";

  // Throws SafetensorsError: not a directory, no *.safetensors files, a bad file, a bad index.
  static CheckpointDir open(const std::filesystem::path& dir);
  static CheckpointDir open(const std::filesystem::path& dir, SafetensorsFile::Options options);

  const std::filesystem::path& dir() const { return dir_; }
  // All tensor names across files, sorted.
  std::vector<std::string> names() const;
  std::size_t size() const { return where_.size(); }
  bool contains(std::string_view name) const;
  // Throws "tensor 'x' not found in checkpoint DIR (N tensors in K files)".
  const TensorInfo& find(std::string_view name) const;
  // The file that serves `name` (throws like find when absent).
  const SafetensorsFile& file_of(std::string_view name) const;
  // Opened files in file-name order.
  const std::vector<SafetensorsFile>& files() const { return files_; }
  bool has_index() const { return has_index_; }

 private:
  std::filesystem::path dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::size_t, std::less<>> where_;  // tensor name -> index into files_
  bool has_index_ = false;
};

}  // namespace moekit::io
