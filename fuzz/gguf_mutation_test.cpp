// gguf_mutation_sanitized: runs the GGUF reader over a few thousand mutants of valid files, under
// AddressSanitizer and UBSan (this file and the reader's sources are compiled with them; see
// fuzz/CMakeLists.txt).
//
// The seeds come from GgufWriter (gguf_seeds.cpp). A small independent walker finds where every field of a
// seed lies (counts, lengths, types, dims, offsets, the alignment value), and the mutants are made
// deterministically from --seed: random bit flips and byte overwrites with interesting values, truncations at
// every field, huge or boundary values written into each count / length / dim / type / offset field,
// duplicated names, misaligned and overlapping offsets, spliced bytes. Each mutant is parsed from memory (an
// exactly sized heap buffer, so ASan sees any read past its end) and from a real file through open(); both
// must either parse or throw tandem::Error with the same message, and a file that parses is walked completely
// (every value, every tensor byte). Any other exception fails the test; any sanitizer finding aborts it.
//
//   gguf_mutation_test [--seed N] [--rounds N] [--write-seeds DIR]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf_seeds.h"
#include "gguf_walk.h"

namespace {

using namespace tandem;
using namespace tandem::gguf;

enum class Kind {
  Count,
  Length,
  ValueType,
  ArrayType,
  ArrayCount,
  NDims,
  Dim,
  TensorType,
  Offset,
  Alignment,
  Bool
};

struct Field {
  size_t at;
  size_t width;
  Kind kind;
};

struct Layout {
  std::vector<Field> fields;
  std::vector<std::pair<size_t, size_t>> names;  // tensor names: offset of the bytes, length
  std::vector<std::pair<size_t, size_t>> keys;   // metadata keys: same
  std::vector<size_t> boundaries;                // start of each region (kv, info, data, tensor data)
  size_t alignment = 32;
  size_t data_offset = 0;
};

// Walks a valid file (a seed) and records where its fields are. Trusts the input: seeds come from the writer.
class SeedWalker {
 public:
  explicit SeedWalker(const std::vector<uint8_t>& b) : b_(b) {}

  Layout run() {
    pos_ = 8;
    field(8, Kind::Count);
    uint64_t n_tensors = u64();
    field(8, Kind::Count);
    uint64_t n_kv = u64();
    for (uint64_t i = 0; i < n_kv; ++i) {
      lay_.boundaries.push_back(pos_);
      size_t key_at = pos_ + 8;
      std::string key = str(&lay_.keys);
      field(4, Kind::ValueType);
      uint32_t type = u32();
      if (key == "general.alignment") {
        field(4, Kind::Alignment);
        lay_.alignment = u32();
        continue;
      }
      (void)key_at;
      value(type);
    }
    for (uint64_t i = 0; i < n_tensors; ++i) {
      lay_.boundaries.push_back(pos_);
      str(&lay_.names);
      field(4, Kind::NDims);
      uint32_t n_dims = u32();
      for (uint32_t d = 0; d < n_dims; ++d) {
        field(8, Kind::Dim);
        pos_ += 8;
      }
      field(4, Kind::TensorType);
      pos_ += 4;
      field(8, Kind::Offset);
      offsets_.push_back(u64());
    }
    lay_.boundaries.push_back(pos_);
    lay_.data_offset = (pos_ + lay_.alignment - 1) / lay_.alignment * lay_.alignment;
    for (uint64_t off : offsets_) lay_.boundaries.push_back(lay_.data_offset + off);
    lay_.boundaries.push_back(b_.size());
    return lay_;
  }

 private:
  void field(size_t width, Kind kind) { lay_.fields.push_back({pos_, width, kind}); }
  uint64_t u64() {
    uint64_t v;
    std::memcpy(&v, &b_[pos_], 8);
    pos_ += 8;
    return v;
  }
  uint32_t u32() {
    uint32_t v;
    std::memcpy(&v, &b_[pos_], 4);
    pos_ += 4;
    return v;
  }
  std::string str(std::vector<std::pair<size_t, size_t>>* where = nullptr) {
    field(8, Kind::Length);
    uint64_t n = u64();
    if (where) where->emplace_back(pos_, size_t(n));
    std::string s(reinterpret_cast<const char*>(&b_[pos_]), size_t(n));
    pos_ += n;
    return s;
  }
  void value(uint32_t type) {
    static const size_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) {
      str();
    } else if (type == 9) {
      field(4, Kind::ArrayType);
      uint32_t elem = u32();
      field(8, Kind::ArrayCount);
      uint64_t n = u64();
      for (uint64_t i = 0; i < n; ++i) value(elem);
    } else {
      if (type == 7) field(1, Kind::Bool);
      pos_ += sizes[type];
    }
  }

  const std::vector<uint8_t>& b_;
  size_t pos_ = 0;
  Layout lay_;
  std::vector<uint64_t> offsets_;
};

class Mutator {
 public:
  Mutator(const std::vector<uint8_t>& seed, uint64_t rng_seed)
      : seed_(seed), lay_(SeedWalker(seed).run()), rng_(rng_seed) {}

  // Appends every mutant of this seed to out.
  void all(std::vector<std::vector<uint8_t>>& out, int rounds) {
    for (int r = 0; r < rounds; ++r) {
      for (int i = 0; i < 150; ++i) out.push_back(bit_flips());
      for (int i = 0; i < 100; ++i) out.push_back(byte_overwrites());
      for (int i = 0; i < 20; ++i) out.push_back(splice());
      for (int i = 0; i < 10; ++i) out.push_back(copy_chunk());
    }
    truncations(out);
    field_values(out);
    duplicate_names(out, lay_.names);
    duplicate_names(out, lay_.keys);
    bad_offsets(out);
  }

 private:
  uint64_t below(uint64_t n) { return n ? rng_() % n : 0; }
  // Most mutations hit the header, metadata and infos, where the parser's decisions are.
  size_t position() {
    size_t header = std::max<size_t>(lay_.data_offset, 1);
    return below(4) ? size_t(below(std::min(header, seed_.size()))) : size_t(below(seed_.size()));
  }

  std::vector<uint8_t> bit_flips() {
    auto m = seed_;
    for (uint64_t k = 0, n = 1 + below(4); k < n; ++k) m[position()] ^= uint8_t(1u << below(8));
    return m;
  }

  std::vector<uint8_t> byte_overwrites() {
    static const uint8_t interesting[] = {0x00, 0xFF, 0x7F, 0x80, 0x01, 0xFE, 0x40, 0x20, 0x0C, 0x09};
    auto m = seed_;
    for (uint64_t k = 0, n = 1 + below(3); k < n; ++k) m[position()] = interesting[below(sizeof interesting)];
    return m;
  }

  // Inserts or removes a few bytes, shifting everything after.
  std::vector<uint8_t> splice() {
    auto m = seed_;
    size_t at = position();
    size_t n = 1 + size_t(below(9));
    if (below(2)) {
      m.insert(m.begin() + long(at), n, uint8_t(rng_()));
    } else {
      m.erase(m.begin() + long(at), m.begin() + long(std::min(m.size(), at + n)));
    }
    return m;
  }

  std::vector<uint8_t> copy_chunk() {
    auto m = seed_;
    size_t from = position(), to = position();
    size_t n = std::min({size_t(1 + below(24)), m.size() - from, m.size() - to});
    std::memmove(&m[to], &seed_[from], n);
    return m;
  }

  void truncations(std::vector<std::vector<uint8_t>>& out) {
    std::vector<size_t> cuts = lay_.boundaries;
    for (const Field& f : lay_.fields) {
      cuts.push_back(f.at);
      cuts.push_back(f.at + 1);
      cuts.push_back(f.at + f.width - 1);
    }
    for (size_t c : {size_t(0), size_t(1), size_t(3), size_t(4), size_t(7), seed_.size() - 1})
      cuts.push_back(c);
    for (size_t c : cuts)
      if (c < seed_.size()) out.emplace_back(seed_.begin(), seed_.begin() + long(c));
  }

  template <class T>
  std::vector<uint8_t> with(const Field& f, T v) {
    auto m = seed_;
    std::memcpy(&m[f.at], &v, std::min(sizeof(T), f.width));
    return m;
  }

  // Boundary and huge values written into every structural field.
  void field_values(std::vector<std::vector<uint8_t>>& out) {
    const uint64_t n = seed_.size();
    const std::vector<uint64_t> wide = {0,
                                        1,
                                        2,
                                        n - 1,
                                        n,
                                        n + 1,
                                        n * 2,
                                        1u << 31,
                                        1ull << 32,
                                        1ull << 62,
                                        0x7FFFFFFFFFFFFFFFull,
                                        1ull << 63,
                                        ~0ull,
                                        ~0ull - 7};
    const std::vector<uint64_t> narrow = {0,  1,  2,  3,   4,  5,        7,          8,          9,
                                          10, 12, 13, 14,  15, 24,       28,         29,         30,
                                          31, 42, 43, 255, 64, 1u << 31, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000};
    for (const Field& f : lay_.fields) {
      const auto& values = f.width == 8 ? wide : narrow;
      // Types and alignments get every value; other fields a random half, to keep the run short.
      bool all = f.kind == Kind::ValueType || f.kind == Kind::ArrayType || f.kind == Kind::TensorType ||
                 f.kind == Kind::Alignment || f.kind == Kind::Count || f.kind == Kind::NDims;
      for (uint64_t v : values) {
        if (!all && below(2)) continue;
        if (f.width == 1) {
          out.push_back(with(f, uint8_t(v)));
        } else if (f.width == 4) {
          out.push_back(with(f, uint32_t(v)));
        } else {
          out.push_back(with(f, v));
        }
      }
    }
  }

  // Copies one name over another of the same length: duplicate tensor names / keys.
  void duplicate_names(std::vector<std::vector<uint8_t>>& out,
                       const std::vector<std::pair<size_t, size_t>>& names) {
    for (size_t i = 0; i < names.size(); ++i)
      for (size_t j = 0; j < names.size(); ++j)
        if (i != j && names[i].second == names[j].second) {
          auto m = seed_;
          std::memcpy(&m[names[j].first], &seed_[names[i].first], names[i].second);
          out.push_back(std::move(m));
        }
  }

  // Misaligned, overlapping and shifted tensor offsets.
  void bad_offsets(std::vector<std::vector<uint8_t>>& out) {
    std::vector<Field> offs;
    for (const Field& f : lay_.fields)
      if (f.kind == Kind::Offset) offs.push_back(f);
    for (const Field& f : offs) {
      uint64_t cur;
      std::memcpy(&cur, &seed_[f.at], 8);
      for (uint64_t delta : {uint64_t(1), uint64_t(lay_.alignment / 2), uint64_t(lay_.alignment),
                             uint64_t(-1), uint64_t(0) - lay_.alignment, uint64_t(4096)})
        out.push_back(with(f, cur + delta));
      for (const Field& g : offs) {
        uint64_t other;
        std::memcpy(&other, &seed_[g.at], 8);
        if (g.at != f.at) out.push_back(with(f, other));  // two tensors at one offset
      }
    }
  }

  const std::vector<uint8_t>& seed_;
  Layout lay_;
  std::mt19937_64 rng_;
};

struct Outcome {
  bool parsed = false;
  std::string error;  // message without the leading "<path>: "
};

std::string strip_path(const std::string& msg, const std::string& path) {
  return msg.rfind(path + ": ", 0) == 0 ? msg.substr(path.size() + 2) : msg;
}

Outcome parse_memory(const std::vector<uint8_t>& m) {
  // An exactly sized heap copy: ASan reports any read past the end.
  std::unique_ptr<uint8_t[]> buf(new uint8_t[std::max<size_t>(m.size(), 1)]);
  if (!m.empty()) std::memcpy(buf.get(), m.data(), m.size());
  try {
    GgufFile f = GgufFile::from_memory(m.empty() ? nullptr : buf.get(), m.size(), "mutant");
    fuzzing::walk_file(f);
    return {true, ""};
  } catch (const Error& e) {
    return {false, strip_path(e.what(), "mutant")};
  }
}

Outcome parse_file(const std::vector<uint8_t>& m, const std::string& path) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(m.data()), std::streamsize(m.size()));
  }
  try {
    GgufFile f = GgufFile::open(path);
    fuzzing::walk_file(f);
    return {true, ""};
  } catch (const Error& e) {
    return {false, strip_path(e.what(), path)};
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 1;
  int rounds = 1;
  std::string seeds_dir;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seed" && i + 1 < argc) {
      seed = std::stoull(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::stoi(argv[++i]);
    } else if (a == "--write-seeds" && i + 1 < argc) {
      seeds_dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--seed N] [--rounds N] [--write-seeds DIR]\n", argv[0]);
      return 2;
    }
  }
  auto seeds = fuzzing::make_gguf_seeds();
  if (!seeds_dir.empty()) {  // a libFuzzer corpus
    std::filesystem::create_directories(seeds_dir);
    for (size_t i = 0; i < seeds.size(); ++i) {
      std::ofstream out(seeds_dir + "/seed" + std::to_string(i) + ".gguf", std::ios::binary);
      out.write(reinterpret_cast<const char*>(seeds[i].data()), std::streamsize(seeds[i].size()));
    }
    std::printf("wrote %zu seeds to %s\n", seeds.size(), seeds_dir.c_str());
    return 0;
  }

  const auto start = std::chrono::steady_clock::now();
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("tandem_gguf_mutant_" + std::to_string(::getpid()) + ".gguf"))
                               .string();
  size_t total = 0, parsed = 0, failures = 0;
  try {
    for (size_t s = 0; s < seeds.size(); ++s) {
      // The seeds themselves must parse.
      if (!parse_memory(seeds[s]).parsed) {
        std::fprintf(stderr, "FAIL: seed %zu does not parse: %s\n", s, parse_memory(seeds[s]).error.c_str());
        return 1;
      }
      std::vector<std::vector<uint8_t>> mutants;
      Mutator(seeds[s], seed * 1000003 + s).all(mutants, rounds);
      for (size_t i = 0; i < mutants.size(); ++i) {
        Outcome mem = parse_memory(mutants[i]);
        Outcome file = parse_file(mutants[i], path);
        ++total;
        parsed += mem.parsed;
        if (mem.parsed != file.parsed || mem.error != file.error) {
          ++failures;
          std::fprintf(stderr, "FAIL: seed %zu mutant %zu: from_memory and open() disagree:\n  %s\n  %s\n", s,
                       i, mem.parsed ? "parsed" : mem.error.c_str(),
                       file.parsed ? "parsed" : file.error.c_str());
        }
        if (!mem.parsed && mem.error.find(" at byte ") == std::string::npos) {
          ++failures;
          std::fprintf(stderr, "FAIL: seed %zu mutant %zu: message without a byte offset: %s\n", s, i,
                       mem.error.c_str());
        }
      }
    }
  } catch (const std::exception& e) {  // anything but tandem::Error escaped the reader
    std::fprintf(stderr, "FAIL: unexpected exception: %s\n", e.what());
    std::filesystem::remove(path);
    return 1;
  }
  std::filesystem::remove(path);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "gguf mutation test: %zu mutants of %zu seeds (seed %llu): %zu parsed, %zu rejected with an Error, "
      "%zu failures, %.1f s\n",
      total, seeds.size(), static_cast<unsigned long long>(seed), parsed, total - parsed, failures, secs);
  return failures ? 1 : 0;
}
