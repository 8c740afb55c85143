// Device backend of a CPU-only build: every CUDA request fails clearly.
#include <stdexcept>

#include "device_backend.h"

namespace es {
namespace device {
namespace {
[[noreturn]] void no_cuda() {
  throw std::runtime_error("easyscale_ext was built without CUDA; rebuild with a CUDA toolkit and a CUDA-enabled torch "
                           "(EASYSCALE_CUDA=1) to keep contexts in pinned or device memory");
}
}  // namespace

bool built() { return false; }
bool available() { return false; }
void* alloc(Location, int64_t, int) { no_cuda(); }
void release(Location, void*, int) { no_cuda(); }
void copy_async(const std::vector<CopyJob>&, bool, int, void*) { no_cuda(); }
void copy_sync(void*, const void*, int64_t, int) { no_cuda(); }
void* side_stream(int) { no_cuda(); }
void* new_event(int) { no_cuda(); }
void destroy_event(void*) { no_cuda(); }
void record(void*, void*) { no_cuda(); }
void stream_wait(void*, void*) { no_cuda(); }
void event_sync(void*) { no_cuda(); }

}  // namespace device
}  // namespace es
