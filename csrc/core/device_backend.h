// The few CUDA runtime services the context store needs. Provided by
// cuda/device_backend_cuda.cu in CUDA builds and by device_backend_none.cpp
// otherwise, so the store itself has no #ifdef and no CUDA headers.
#pragma once
#include <cstdint>
#include <vector>

namespace es {

enum class Location : int32_t { Host = 0, Pinned = 1, Device = 2 };
const char* location_name(Location where);

namespace device {

// Whether this build has the CUDA backend, and whether a device is present.
bool built();
bool available();
// Pinned host memory is allocated mapped and portable, so kernels on any
// device can read and write it directly.
void* alloc(Location where, int64_t bytes, int device);
void release(Location where, void* ptr, int device);

struct CopyJob {
  void* dst;
  const void* src;
  int64_t bytes;
};
// Enqueues all copies on `stream` in batched kernel launches, except large
// copies between host and device, which go to the copy engines.
void copy_async(const std::vector<CopyJob>& jobs, bool device_to_device, int device, void* stream);

// Blocking copy between host and device memory (serialisation only).
void copy_sync(void* dst, const void* src, int64_t bytes, int device);

void* side_stream(int device);  // created once per device, non-blocking
void* new_event(int device);
void destroy_event(void* event);
void record(void* event, void* stream);
void stream_wait(void* stream, void* event);
void event_sync(void* event);

}  // namespace device
}  // namespace es
