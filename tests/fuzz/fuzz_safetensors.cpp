// libFuzzer target: SafetensorsFile::open on arbitrary bytes. An input either opens — and then
// every tensor's bytes lie inside the file and hold exactly numel * bits / 8 bytes, and the file
// survives a write / re-open round trip through SafetensorsWriter unchanged — or it throws
// SafetensorsError. A crash, a sanitizer report, another exception or a broken invariant is a
// finding.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "moekit/io/safetensors.h"

namespace {

namespace fs = std::filesystem;
using moekit::io::SafetensorsError;
using moekit::io::SafetensorsFile;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz_safetensors: invariant broken: %s\n", what.c_str());
  std::abort();
}

// An in-memory file (memfd) opened by path through /proc/self/fd: the reader maps it like any
// regular file, without a disk write per input.
class MemFile {
 public:
  explicit MemFile(const char* name) : fd_(::memfd_create(name, 0)) {
    if (fd_ < 0) finding("memfd_create failed");
  }
  fs::path path() const { return "/proc/self/fd/" + std::to_string(fd_); }
  void assign(const void* data, std::size_t size) const {
    if (::ftruncate(fd_, 0) != 0) finding("ftruncate failed");
    const auto* p = static_cast<const char*>(data);
    for (std::size_t done = 0; done < size;) {
      const ssize_t n = ::pwrite(fd_, p + done, size - done, static_cast<off_t>(done));
      if (n <= 0) finding("pwrite failed");
      done += static_cast<std::size_t>(n);
    }
  }

 private:
  int fd_;
};

const MemFile& input_file() {
  static const MemFile f("moekit_fuzz_in");
  return f;
}

const MemFile& round_trip_file() {
  static const MemFile f("moekit_fuzz_again");
  return f;
}

void check_opened(const SafetensorsFile& f) {
  const auto file = f.file_bytes();
  moekit::io::SafetensorsWriter writer;
  for (const auto& [k, v] : f.metadata())
    writer.set_metadata(k, v);
  for (const std::string& name : f.names()) {
    const moekit::io::TensorInfo& t = f.info(name);
    if (!t.bytes.empty() && (t.bytes.data() < file.data() ||
                             t.bytes.data() + t.bytes.size() > file.data() + file.size())) {
      finding("tensor '" + name + "' lies outside the file");
    }
    if (moekit::io::tensor_nbytes(t.dtype, t.shape) != t.bytes.size()) {
      finding("tensor '" + name + "' byte count differs from its dtype and shape");
    }
    if (t.numel() < 0) finding("tensor '" + name + "' has a negative numel");
    if (const auto bad = moekit::io::first_non_finite(t); bad && (*bad < 0 || *bad >= t.numel())) {
      finding("tensor '" + name + "' reports a non-finite element outside the tensor");
    }
    unsigned sum = 0;
    for (std::byte b : t.bytes)
      sum += std::to_integer<unsigned>(b);  // every byte must be readable
    (void)sum;
    writer.add(name, t.dtype, t.shape, t.bytes);
  }
  // Round trip: what the reader accepted, the writer must write and the reader read back.
  const auto bytes = writer.serialize();
  round_trip_file().assign(bytes.data(), bytes.size());
  const SafetensorsFile g = SafetensorsFile::open(round_trip_file().path());
  if (g.names() != f.names() || g.metadata() != f.metadata()) finding("round trip changed names");
  for (const std::string& name : f.names()) {
    const auto& a = f.info(name);
    const auto& b = g.info(name);
    if (a.dtype != b.dtype || a.shape != b.shape || a.bytes.size() != b.bytes.size() ||
        !std::equal(a.bytes.begin(), a.bytes.end(), b.bytes.begin())) {
      finding("round trip changed tensor '" + name + "'");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  input_file().assign(data, size);
  for (bool holes : {false, true}) {
    SafetensorsFile::Options options;
    options.allow_holes = holes;
    std::optional<SafetensorsFile> f;
    try {
      f = SafetensorsFile::open(input_file().path(), options);
    } catch (const SafetensorsError&) {
      continue;  // refused with a message: the expected outcome for most inputs
    }
    try {
      check_opened(*f);
    } catch (const SafetensorsError& e) {
      finding(std::string("an accepted file failed the round trip: ") + e.what());
    }
  }
  return 0;
}
