#include "context_store.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace es {

const char* location_name(Location where) {
  switch (where) {
    case Location::Host: return "host";
    case Location::Pinned: return "pinned";
    case Location::Device: return "device";
  }
  return "unknown";
}

namespace {

constexpr int64_t kAlign = 64;
constexpr int64_t kPage = 4096;
constexpr int64_t kSlabBytes = 16 << 20;
constexpr int64_t kParallelCopyBytes = 4 << 20;
constexpr char kMagic[8] = {'E', 'S', 'C', 'T', 'X', '0', '0', '1'};

int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

std::string key_text(int64_t worker, const std::string& name) {
  return "(worker " + std::to_string(worker) + ", '" + name + "')";
}

// Host copies in one parallel region: thread t takes the t-th equal share of
// the jobs' bytes laid end to end, so buffers of every size are split across
// the threads and no region is forked per buffer.
void parallel_copy(const std::vector<device::CopyJob>& jobs, int num_threads) {
  int64_t total = 0;
  for (const device::CopyJob& job : jobs) total += job.bytes;
  if (total < kParallelCopyBytes || num_threads <= 1) {
    for (const device::CopyJob& job : jobs)
      if (job.bytes > 0) memcpy(job.dst, job.src, job.bytes);
    return;
  }
  const int64_t share = round_up((total + num_threads - 1) / num_threads, kAlign);
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int t = 0; t < num_threads; ++t) {
    const int64_t begin = t * share, end = std::min(total, begin + share);
    int64_t at = 0;  // where the job's first byte lies in the concatenation
    for (const device::CopyJob& job : jobs) {
      const int64_t lo = std::max(begin, at), hi = std::min(end, at + job.bytes);
      if (lo < hi) memcpy(static_cast<char*>(job.dst) + (lo - at), static_cast<const char*>(job.src) + (lo - at), hi - lo);
      at += job.bytes;
      if (at >= end) break;
    }
  }
}

// Word-at-a-time 64-bit hash: detects truncation and corruption, fast enough
// to run over every serialised context.
uint64_t checksum(const uint8_t* data, int64_t size) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(size);
  int64_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    memcpy(&w, data + i, 8);
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  for (; i < size; ++i) h = (h ^ data[i]) * 0x100000001B3ull;
  return h;
}

class Writer {
 public:
  void i64(int64_t v) { raw(&v, 8); }
  void str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    raw(s.data(), static_cast<int64_t>(s.size()));
  }
  void raw(const void* p, int64_t n) {
    size_t at = out.size();
    out.resize(at + n);
    if (n) memcpy(out.data() + at, p, n);
  }
  uint8_t* reserve(int64_t n) {
    size_t at = out.size();
    out.resize(at + n);
    return out.data() + at;
  }
  std::vector<uint8_t> out;
};

class Reader {
 public:
  Reader(const uint8_t* data, int64_t size) : data_(data), size_(size) {}
  int64_t i64() {
    int64_t v;
    memcpy(&v, take(8), 8);
    return v;
  }
  std::string str() {
    int64_t n = i64();
    if (n < 0 || n > size_) corrupt();
    return std::string(reinterpret_cast<const char*>(take(n)), n);
  }
  const uint8_t* take(int64_t n) {
    if (n < 0 || pos_ + n > size_) corrupt();
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  [[noreturn]] static void corrupt() {
    throw std::invalid_argument("context bytes are truncated or corrupted (layout does not parse)");
  }

 private:
  const uint8_t* data_;
  int64_t size_;
  int64_t pos_ = 0;
};

}  // namespace

ContextStore::ContextStore(int64_t capacity_bytes, int num_threads)
    : capacity_(capacity_bytes), num_threads_(std::max(1, num_threads)) {
  if (capacity_bytes <= 0)
    throw std::invalid_argument("ContextStore: capacity_bytes must be positive, got " + std::to_string(capacity_bytes));
}

ContextStore::~ContextStore() {
  try {
    wait_locked();
  } catch (...) {
  }
  for (auto& kv : entries_)
    if (kv.second.saved_event) device::destroy_event(kv.second.saved_event);
  for (Slab& s : slabs_) {
    if (s.where == Location::Host) std::free(s.base);
    else device::release(s.where, s.base, s.device);
  }
}

int64_t ContextStore::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const Slab& s : slabs_) total += s.bytes;
  return total;
}

int64_t ContextStore::slab_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(slabs_.size());
}

ContextStore::Region ContextStore::allocate(Location where, int device, int64_t bytes) {
  bytes = std::max<int64_t>(round_up(bytes, kAlign), kAlign);
  // Reuse a freed region first (best fit), then carve from an open slab.
  auto best = free_regions_.end();
  for (auto it = free_regions_.begin(); it != free_regions_.end(); ++it)
    if (it->where == where && it->device == device && it->bytes >= bytes &&
        (best == free_regions_.end() || it->bytes < best->bytes))
      best = it;
  if (best != free_regions_.end()) {
    Region r = *best;
    free_regions_.erase(best);
    return r;
  }
  for (Slab& s : slabs_)
    if (s.where == where && s.device == device && s.bytes - s.used >= bytes) {
      Region r{where, device, s.base + s.used, bytes};
      s.used += bytes;
      return r;
    }
  int64_t held = 0;
  for (const Slab& s : slabs_) held += s.bytes;
  int64_t slab_bytes = round_up(std::max(bytes, kSlabBytes), kPage);
  if (held + slab_bytes > capacity_) slab_bytes = round_up(bytes, kPage);
  if (held + slab_bytes > capacity_)
    throw OverCapacity("context store over its memory cap: needs " + std::to_string(slab_bytes) +
                       " more bytes, holds " + std::to_string(held) + " of " + std::to_string(capacity_) +
                       "; raise capacity_bytes or erase workers that left");
  char* base = where == Location::Host ? static_cast<char*>(std::aligned_alloc(kPage, slab_bytes))
                                       : static_cast<char*>(device::alloc(where, slab_bytes, device));
  if (!base) throw OverCapacity("context store: host allocation of " + std::to_string(slab_bytes) + " bytes failed");
  slabs_.push_back({where, device, base, slab_bytes, bytes});
  return {where, device, base, bytes};
}

ContextStore::Entry& ContextStore::create(int64_t worker, const std::string& name, const std::string& signature,
                                          const std::vector<int64_t>& sizes, Location where, int device) {
  Entry e;
  e.signature = signature;
  e.sizes = sizes;
  int64_t total = 0;
  for (int64_t s : sizes) {
    e.offsets.push_back(total);
    total += round_up(s, kAlign);
  }
  e.region = allocate(where, device, total);
  if (where != Location::Host) e.saved_event = device::new_event(device);
  return entries_.emplace(std::make_pair(worker, name), std::move(e)).first->second;
}

ContextStore::Entry& ContextStore::find(int64_t worker, const std::string& name) {
  auto it = entries_.find({worker, name});
  if (it == entries_.end()) throw UnknownContext("no context saved for " + key_text(worker, name));
  return it->second;
}

const ContextStore::Entry& ContextStore::find(int64_t worker, const std::string& name) const {
  return const_cast<ContextStore*>(this)->find(worker, name);
}

void ContextStore::check_layout(const Entry& e, int64_t worker, const std::string& name,
                                const std::string& signature, const std::vector<Buffer>& buffers) const {
  bool same = e.signature == signature && e.sizes.size() == buffers.size();
  for (size_t i = 0; same && i < buffers.size(); ++i)
    same = buffers[i].bytes == e.sizes[i] && buffers[i].device == e.region.device;
  if (!same)
    throw std::invalid_argument("context " + key_text(worker, name) + " was saved as [" + e.signature +
                                "] but these tensors are [" + signature +
                                "]: shape, dtype and device must match the first save");
}

namespace {
int common_device(const std::vector<Buffer>& buffers, int64_t worker, const std::string& name) {
  int device = buffers.empty() ? -1 : buffers[0].device;
  for (const Buffer& b : buffers)
    if (b.device != device)
      throw std::invalid_argument("context " + key_text(worker, name) +
                                  ": all tensors of one entry must be on one device");
  return device;
}
}  // namespace

void ContextStore::save(int64_t worker, const std::string& name, const std::string& signature,
                        const std::vector<Buffer>& buffers, Location where, void* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int device = common_device(buffers, worker, name);
  if ((device < 0) != (where == Location::Host))
    throw std::invalid_argument("context " + key_text(worker, name) + ": " +
                                (device < 0 ? "CPU tensors are kept in host memory; use location 'host'"
                                            : "CUDA tensors are kept in 'pinned' or 'device' memory"));
  auto it = entries_.find({worker, name});
  if (it == entries_.end()) {
    std::vector<int64_t> sizes;
    for (const Buffer& b : buffers) sizes.push_back(b.bytes);
    // The region's device tag is the tensors' device, pinned memory included.
    create(worker, name, signature, sizes, where, device);
    it = entries_.find({worker, name});
  } else if (it->second.region.where != where) {
    throw std::invalid_argument("context " + key_text(worker, name) + " lives in " +
                                location_name(it->second.region.where) + " memory, not " + location_name(where));
  }
  Entry& e = it->second;
  check_layout(e, worker, name, signature, buffers);
  std::vector<device::CopyJob> jobs;
  for (size_t i = 0; i < buffers.size(); ++i)
    jobs.push_back({e.region.base + e.offsets[i], buffers[i].data, buffers[i].bytes});
  if (device < 0) {
    parallel_copy(jobs, num_threads_);
    return;
  }
  void* side = device::side_stream(device);
  device::record(e.saved_event, stream);  // the tensors are final once `stream` gets here
  device::stream_wait(side, e.saved_event);
  device::copy_async(jobs, where == Location::Device, device, side);
  device::record(e.saved_event, side);
  if (std::find(pending_saves_.begin(), pending_saves_.end(), std::make_pair(device, e.saved_event)) ==
      pending_saves_.end())
    pending_saves_.emplace_back(device, e.saved_event);
}

void ContextStore::restore(int64_t worker, const std::string& name, const std::string& signature,
                           const std::vector<Buffer>& buffers, void* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = find(worker, name);
  check_layout(e, worker, name, signature, buffers);
  const int device = e.region.device;
  std::vector<device::CopyJob> jobs;
  for (size_t i = 0; i < buffers.size(); ++i)
    jobs.push_back({buffers[i].data, e.region.base + e.offsets[i], buffers[i].bytes});
  if (device < 0) {
    parallel_copy(jobs, num_threads_);
    return;
  }
  for (auto& p : pending_saves_)
    if (p.first == device) device::stream_wait(stream, p.second);
  device::copy_async(jobs, e.region.where == Location::Device, device, stream);
}

void ContextStore::order_after_saves(int device, void* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& p : pending_saves_)
    if (p.first == device) device::stream_wait(stream, p.second);
}

void ContextStore::wait() {
  std::lock_guard<std::mutex> lock(mutex_);
  wait_locked();
}

void ContextStore::wait_locked() {
  for (auto& p : pending_saves_) device::event_sync(p.second);
  pending_saves_.clear();
}

bool ContextStore::contains(int64_t worker, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.count({worker, name}) > 0;
}

std::vector<int64_t> ContextStore::workers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int64_t> out;
  for (const auto& kv : entries_)
    if (out.empty() || out.back() != kv.first.first) out.push_back(kv.first.first);
  return out;
}

std::vector<std::string> ContextStore::names(int64_t worker) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  for (auto it = entries_.lower_bound({worker, std::string()}); it != entries_.end() && it->first.first == worker; ++it)
    out.push_back(it->first.second);
  return out;
}

std::string ContextStore::signature(int64_t worker, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return find(worker, name).signature;
}

int ContextStore::device(int64_t worker, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return find(worker, name).region.device;
}

ContextStore::EntryMap::iterator ContextStore::release(EntryMap::iterator it) {
  free_regions_.push_back(it->second.region);
  if (it->second.saved_event) device::destroy_event(it->second.saved_event);
  return entries_.erase(it);
}

void ContextStore::erase(int64_t worker) {
  std::lock_guard<std::mutex> lock(mutex_);
  wait_locked();
  for (auto it = entries_.lower_bound({worker, std::string()}); it != entries_.end() && it->first.first == worker;)
    it = release(it);
}

void ContextStore::erase(int64_t worker, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  wait_locked();
  auto it = entries_.find({worker, name});
  if (it != entries_.end()) release(it);
}

std::vector<uint8_t> ContextStore::serialize(int64_t worker) {
  std::lock_guard<std::mutex> lock(mutex_);
  wait_locked();
  Writer w;
  w.raw(kMagic, sizeof(kMagic));
  w.i64(worker);
  auto first = entries_.lower_bound({worker, std::string()});
  int64_t count = 0;
  for (auto it = first; it != entries_.end() && it->first.first == worker; ++it) ++count;
  if (count == 0) throw UnknownContext("no context saved for worker " + std::to_string(worker));
  w.i64(count);
  for (auto it = first; it != entries_.end() && it->first.first == worker; ++it) {
    const Entry& e = it->second;
    w.str(it->first.second);
    w.str(e.signature);
    w.i64(e.region.device);
    w.i64(static_cast<int64_t>(e.sizes.size()));
    for (int64_t s : e.sizes) w.i64(s);
    for (size_t i = 0; i < e.sizes.size(); ++i) {
      uint8_t* dst = w.reserve(e.sizes[i]);
      if (e.region.where == Location::Device) device::copy_sync(dst, e.region.base + e.offsets[i], e.sizes[i], e.region.device);
      else if (e.sizes[i]) memcpy(dst, e.region.base + e.offsets[i], e.sizes[i]);
    }
  }
  uint64_t h = checksum(w.out.data(), static_cast<int64_t>(w.out.size()));
  w.raw(&h, 8);
  return std::move(w.out);
}

int64_t ContextStore::deserialize(const uint8_t* data, int64_t size, int device) {
  if (size < static_cast<int64_t>(sizeof(kMagic)) + 8 || memcmp(data, kMagic, sizeof(kMagic)) != 0)
    throw std::invalid_argument("not a serialised easyscale context (bad magic or too short)");
  uint64_t stored;
  memcpy(&stored, data + size - 8, 8);
  if (checksum(data, size - 8) != stored)
    throw std::invalid_argument("context bytes are truncated or corrupted (checksum mismatch)");

  // Parse and check everything first: a rejected call changes nothing.
  struct Parsed {
    std::string name, signature;
    int device;
    std::vector<int64_t> sizes;
    std::vector<const uint8_t*> data;
  };
  Reader r(data + sizeof(kMagic), size - 8 - static_cast<int64_t>(sizeof(kMagic)));
  const int64_t worker = r.i64();
  const int64_t count = r.i64();
  if (count < 1 || count > size) Reader::corrupt();
  std::vector<Parsed> parsed(count);
  for (Parsed& p : parsed) {
    p.name = r.str();
    p.signature = r.str();
    p.device = static_cast<int>(r.i64());
    if (p.device >= 0 && device >= 0) p.device = device;
    int64_t buffers = r.i64();
    if (buffers < 0 || buffers > size) Reader::corrupt();
    p.sizes.resize(buffers);
    for (int64_t& s : p.sizes) {
      s = r.i64();
      if (s < 0 || s > size) Reader::corrupt();
    }
    for (int64_t s : p.sizes) p.data.push_back(r.take(s));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  wait_locked();  // an in-flight save must not land on top of what we write
  for (const Parsed& p : parsed) {
    auto it = entries_.find({worker, p.name});
    if (it == entries_.end()) {
      if (p.device >= 0 && !device::available())
        throw std::invalid_argument("context " + key_text(worker, p.name) +
                                    " holds CUDA state but this process has no CUDA device");
    } else if (it->second.signature != p.signature || it->second.sizes != p.sizes) {
      throw std::invalid_argument("context " + key_text(worker, p.name) + " exists as [" + it->second.signature +
                                  "] but the bytes hold [" + p.signature + "]");
    }
  }
  std::vector<std::string> created;
  try {
    for (const Parsed& p : parsed)
      if (!entries_.count({worker, p.name})) {
        create(worker, p.name, p.signature, p.sizes, p.device < 0 ? Location::Host : Location::Pinned, p.device);
        created.push_back(p.name);
      }
  } catch (...) {  // over capacity part-way: undo the entries this call made
    for (const std::string& name : created) release(entries_.find({worker, name}));
    throw;
  }
  for (const Parsed& p : parsed) {
    Entry& e = entries_.find({worker, p.name})->second;
    for (size_t i = 0; i < p.sizes.size(); ++i) {
      if (e.region.where == Location::Device)
        device::copy_sync(e.region.base + e.offsets[i], p.data[i], p.sizes[i], e.region.device);
      else if (p.sizes[i]) memcpy(e.region.base + e.offsets[i], p.data[i], p.sizes[i]);
    }
  }
  return worker;
}

}  // namespace es
