// Per-virtual-worker state snapshots, keyed by (worker, name).
//
// An entry is one flat region holding a list of buffers back to back (64-byte
// aligned), so a switch is one copy per buffer on the CPU and one batched
// launch on CUDA. Regions come from slabs allocated on first use and reused:
// once every entry has been saved once, save and restore allocate nothing.
//
// The first save of a key fixes its layout: the buffer sizes and an opaque
// signature (the torch glue encodes dtype, shape and device there). Later
// saves and every restore must match it exactly, or std::invalid_argument.
//
// Asynchrony (CUDA buffers): save() enqueues its copies on a per-device side
// stream after the caller's `stream` reaches the save, and returns at once,
// so saving one worker overlaps the next worker's compute. The caller must
// not modify the saved buffers other than through restore() until then;
// restore() and order_after_saves() make `stream` wait for every pending
// save, and wait() blocks the host until they are done. CPU buffers are
// copied synchronously (large copies split across threads).
//
// Thread safety: every method may be called from any thread; an internal
// mutex serialises them.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "device_backend.h"

namespace es {

// Unknown (worker, name): mapped to Python's KeyError.
struct UnknownContext : std::out_of_range {
  using std::out_of_range::out_of_range;
};
// The store's memory cap would be exceeded: mapped to Python's MemoryError.
struct OverCapacity : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Buffer {
  void* data;
  int64_t bytes;
  int device;  // -1: host memory, else the CUDA device ordinal
};

class ContextStore {
 public:
  ContextStore(int64_t capacity_bytes, int num_threads);
  ~ContextStore();
  ContextStore(const ContextStore&) = delete;
  ContextStore& operator=(const ContextStore&) = delete;

  // `stream` is the caller's current CUDA stream (ignored for host buffers).
  void save(int64_t worker, const std::string& name, const std::string& signature,
            const std::vector<Buffer>& buffers, Location where, void* stream);
  void restore(int64_t worker, const std::string& name, const std::string& signature,
               const std::vector<Buffer>& buffers, void* stream);
  void order_after_saves(int device, void* stream);
  void wait();

  bool contains(int64_t worker, const std::string& name) const;
  std::vector<int64_t> workers() const;
  std::vector<std::string> names(int64_t worker) const;
  std::string signature(int64_t worker, const std::string& name) const;
  int device(int64_t worker, const std::string& name) const;  // CUDA ordinal of the entry's tensors, -1: CPU
  void erase(int64_t worker);
  void erase(int64_t worker, const std::string& name);  // no-op when absent

  // A worker's whole context as bytes (checksummed), and back. Deserialised
  // entries live in host memory; an existing entry must have the same layout.
  // CUDA entries are for `device` when it is >= 0 (the importing process's
  // GPU: a worker moves between processes on different GPUs), else for the
  // one they were saved from.
  std::vector<uint8_t> serialize(int64_t worker);
  int64_t deserialize(const uint8_t* data, int64_t size, int device = -1);

  int64_t capacity() const { return capacity_; }
  int64_t reserved_bytes() const;  // slab memory held
  int64_t slab_count() const;

 private:
  struct Region {
    Location where;
    int device;
    char* base;
    int64_t bytes;
  };
  struct Entry {
    std::string signature;
    std::vector<int64_t> sizes;
    std::vector<int64_t> offsets;
    Region region;
    void* saved_event = nullptr;  // CUDA entries: completion of the last save
  };
  struct Slab {
    Location where;
    int device;
    char* base;
    int64_t bytes;
    int64_t used;
  };

  using EntryMap = std::map<std::pair<int64_t, std::string>, Entry>;
  EntryMap::iterator release(EntryMap::iterator it);  // frees the region for reuse
  Entry& find(int64_t worker, const std::string& name);
  const Entry& find(int64_t worker, const std::string& name) const;
  Entry& create(int64_t worker, const std::string& name, const std::string& signature,
                const std::vector<int64_t>& sizes, Location where, int device);
  Region allocate(Location where, int device, int64_t bytes);
  void check_layout(const Entry& e, int64_t worker, const std::string& name, const std::string& signature,
                    const std::vector<Buffer>& buffers) const;
  void wait_locked();

  const int64_t capacity_;
  const int num_threads_;
  mutable std::mutex mutex_;
  EntryMap entries_;
  std::vector<Slab> slabs_;
  std::vector<Region> free_regions_;
  std::vector<std::pair<int, void*>> pending_saves_;  // (device, event)
};

}  // namespace es
