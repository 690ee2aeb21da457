// Packed weights on transparent huge pages.
//
// A decode step streams every packed weight once (1 GB a step for a 1.5B model). On 4 KiB pages the hardware
// prefetchers stop at every page boundary and each page costs a TLB miss; on 2 MiB pages a weight streams at up
// to 1.6x the rate (measured here: Gemma 3's 178 MB int8g LM head 5.8 -> 3.5 ms on 2 threads). The kernel here
// runs THP in `madvise` mode: a range gets huge pages only when it is advised MADV_HUGEPAGE before it is first
// touched, and only in whole 2 MiB-aligned pages. So weights are carved from 2 MiB-aligned advised maps: one of
// its own for a weight of at least kChunk, else consecutive pieces of a shared chunk (Gemma 3 270M's layer
// weights are 0.2-1.5 MB each). A map is unmapped when the last tensor on it goes. Where mmap or the advice
// fails (THP off), the buffer is on plain pages and the kernels read the same bytes.

#pragma once

#include <ATen/ATen.h>
#include <sys/mman.h>

#include <cstdint>
#include <memory>
#include <mutex>

namespace infer_cpu {

constexpr int64_t kHugePage = int64_t{2} << 20;
constexpr int64_t kChunk = int64_t{32} << 20;   // a shared map's size
constexpr int64_t kSmallest = int64_t{64} << 10;  // smaller weights: at::zeros
constexpr int64_t kPieceAlign = 4096;           // a piece's start in a shared map

// a 2 MiB-aligned anonymous map of `length` bytes (a multiple of 4 KiB), advised MADV_HUGEPAGE; unmapped with it
struct HugeMap {
  uint8_t* data = nullptr;
  int64_t length = 0;
  explicit HugeMap(int64_t bytes) : length((bytes + 4095) & ~int64_t{4095}) {
    void* raw = mmap(nullptr, length + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return;
    const uintptr_t first = reinterpret_cast<uintptr_t>(raw), end = first + length + kHugePage;
    const uintptr_t start = (first + kHugePage - 1) & ~static_cast<uintptr_t>(kHugePage - 1);
    // NOTE: trimmed to [start, start + length): no 2 MiB of slack a map
    if (start > first) munmap(raw, start - first);
    if (end > start + length) munmap(reinterpret_cast<void*>(start + length), end - start - length);
    data = reinterpret_cast<uint8_t*>(start);
    madvise(data, length, MADV_HUGEPAGE);  // NOTE: a refusal (THP off) leaves plain pages: the same bytes
  }
  ~HugeMap() {
    if (data) munmap(data, length);
  }
  HugeMap(const HugeMap&) = delete;
  HugeMap& operator=(const HugeMap&) = delete;
};

// a tensor of `sizes` at `offset` of `map`, which it keeps alive
inline at::Tensor carve(const std::shared_ptr<HugeMap>& map, int64_t offset, at::IntArrayRef sizes) {
  auto keep = new std::shared_ptr<HugeMap>(map);
  return at::from_blob(map->data + offset, sizes, [keep](void*) { delete keep; }, at::TensorOptions().dtype(at::kByte));
}

// a zeroed uint8 tensor of `sizes` on 2 MiB-aligned maps advised MADV_HUGEPAGE (anonymous maps, zero-filled by
// the kernel); below 64 KiB, at::zeros
inline at::Tensor huge_page_zeros(at::IntArrayRef sizes) {
  int64_t bytes = 1;
  for (const int64_t s : sizes) bytes *= s;
  if (bytes < kSmallest) return at::zeros(sizes, at::kByte);
  if (bytes >= kChunk) {
    auto map = std::make_shared<HugeMap>(bytes);
    return map->data ? carve(map, 0, sizes) : at::zeros(sizes, at::kByte);
  }
  // a piece of the shared chunk (a fresh one when it is full); the chunk goes with its last piece
  static std::mutex mutex;
  static std::weak_ptr<HugeMap> current;
  static int64_t used = kChunk;
  const std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<HugeMap> map = current.lock();
  if (!map || used + bytes > kChunk) {
    map = std::make_shared<HugeMap>(kChunk);
    if (!map->data) return at::zeros(sizes, at::kByte);
    current = map, used = 0;
  }
  at::Tensor piece = carve(map, used, sizes);
  used = (used + bytes + kPieceAlign - 1) & ~(kPieceAlign - 1);
  return piece;
}

}  // namespace infer_cpu
