// The Python module easyscale_ext._C: the stateful context store and the
// canonical-tree planner, bound with pybind11 (they hold raw memory, streams
// and host-side plans, which torch custom classes would add nothing to).
// Stateless tensor ops are torch ops (see ops.cpp).
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <sstream>

#include "../core/canonical_tree.h"
#include "../core/context_store.h"

namespace py = pybind11;

namespace es {
namespace {

Location parse_location(const std::string& s) {
  if (s == "host") return Location::Host;
  if (s == "pinned") return Location::Pinned;
  if (s == "device") return Location::Device;
  throw std::invalid_argument("location must be 'host', 'pinned' or 'device', got '" + s + "'");
}

// "float32[3,4]@cpu;int64[]@cuda:0": enough to check a restore and to
// rebuild the tensors in load().
std::string signature_of(const std::vector<at::Tensor>& tensors) {
  std::ostringstream out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    out << (i ? ";" : "") << c10::toString(t.scalar_type()) << "[";
    for (int64_t d = 0; d < t.dim(); ++d) out << (d ? "," : "") << t.size(d);
    out << "]@" << c10::DeviceTypeName(t.device().type(), /*lower_case=*/true);  // not the ordinal: see load
  }
  return out.str();
}

// Tensors of the signature's dtypes and shapes, CUDA ones on `device`.
std::vector<at::Tensor> empty_like_signature(const std::string& signature, int device) {
  std::vector<at::Tensor> out;
  std::istringstream items(signature);
  std::string item;
  while (std::getline(items, item, ';')) {
    size_t open = item.find('['), close = item.find(']'), at_ = item.find('@');
    TORCH_CHECK(open != std::string::npos && close != std::string::npos && at_ != std::string::npos,
                "malformed context signature '", item, "'");
    std::string type = item.substr(0, open);
    std::vector<int64_t> shape;
    std::istringstream dims(item.substr(open + 1, close - open - 1));
    std::string dim;
    while (std::getline(dims, dim, ',')) shape.push_back(std::stoll(dim));
    at::ScalarType scalar = at::kByte;
    bool found = false;
    for (int s = 0; s < static_cast<int>(at::ScalarType::NumOptions); ++s)
      if (type == c10::toString(static_cast<at::ScalarType>(s))) {
        scalar = static_cast<at::ScalarType>(s);
        found = true;
        break;
      }
    TORCH_CHECK(found, "unknown dtype '", type, "' in context signature");
    at::Device where(item.substr(at_ + 1));
    if (where.is_cuda()) where = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device));
    out.push_back(at::empty(shape, at::TensorOptions().dtype(scalar).device(where)));
  }
  return out;
}

std::vector<Buffer> buffers_of(const std::vector<at::Tensor>& tensors) {
  std::vector<Buffer> out;
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.is_contiguous(), "context tensors must be contiguous; call .contiguous() first");
    TORCH_CHECK(t.is_cpu() || t.is_cuda(), "context tensors must be on CPU or CUDA, got ", t.device());
    out.push_back({t.data_ptr(), static_cast<int64_t>(t.nbytes()), t.is_cuda() ? t.get_device() : -1});
  }
  return out;
}

// The current stream of the tensors' CUDA device, without linking c10_cuda
// into CPU builds.
void* current_stream(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors)
    if (t.is_cuda()) {
      const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
      return impl->getStream(t.device()).native_handle();
    }
  return nullptr;
}

}  // namespace
}  // namespace es

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace es;
  m.doc() = "easyscale_ext native core: context store, canonical reduction tree, deterministic kernels.";
  m.def("cuda_built", &device::built, "Whether the CUDA kernels are compiled into this build.");

  py::register_exception<UnknownContext>(m, "UnknownContextError", PyExc_KeyError);
  py::register_exception<OverCapacity>(m, "ContextStoreFullError", PyExc_MemoryError);

  py::class_<Range>(m, "Range")
      .def_readonly("lo", &Range::lo)
      .def_readonly("hi", &Range::hi)
      .def("__iter__", [](const Range& r) { return py::iter(py::make_tuple(r.lo, r.hi)); })
      .def("__eq__", [](const Range& a, const Range& b) { return a == b; })
      .def("__repr__", [](const Range& r) { return "Range(" + std::to_string(r.lo) + ", " + std::to_string(r.hi) + ")"; });

  m.def("canonical_split", &canonical_split, py::arg("lo"), py::arg("hi"),
        "Split point of tree node [lo, hi): lo + the largest power of two below hi - lo.");
  m.def("is_canonical_node", &is_canonical_node, py::arg("lo"), py::arg("hi"), py::arg("n"),
        "Whether [lo, hi) is a node of the canonical reduction tree over n workers.");
  m.def("local_roots", &local_roots, py::arg("a"), py::arg("b"), py::arg("n"),
        "Maximal canonical-tree nodes inside [a, b): the partial sums a process owning those workers sends.");

  py::class_<FoldOp>(m, "FoldOp")
      .def_readonly("dst", &FoldOp::dst)
      .def_readonly("src", &FoldOp::src)
      .def_readonly("accumulate", &FoldOp::accumulate)
      .def("__repr__", [](const FoldOp& o) {
        return "FoldOp(dst=" + std::to_string(o.dst) + ", src=" + std::to_string(o.src) +
               ", accumulate=" + (o.accumulate ? "True" : "False") + ")";
      });
  m.attr("PUSHED") = FoldOp::kPushed;

  py::class_<FoldStack>(m, "FoldStack",
                        "Plans a streaming fold of canonical-tree nodes into a few partial-sum slots.")
      .def(py::init<int64_t>(), py::arg("n"))
      .def("push", [](FoldStack& s, int64_t lo, int64_t hi) { return s.push({lo, hi}); }, py::arg("lo"), py::arg("hi"),
           "Push the value of node [lo, hi); returns the slot operations to apply in order.")
      .def("nodes", &FoldStack::nodes)
      .def("slots", &FoldStack::slots)
      .def("reset", &FoldStack::reset)
      .def_property_readonly("max_slots", &FoldStack::max_slots)
      .def_property_readonly("n", &FoldStack::n);

  py::class_<ContextStore>(m, "ContextStore", "Per-virtual-worker state snapshots; see csrc/core/context_store.h.")
      .def(py::init<int64_t, int>(), py::arg("capacity_bytes"), py::arg("num_threads") = 1)
      .def("save",
           [](ContextStore& s, int64_t worker, const std::string& name, const std::vector<at::Tensor>& tensors,
              const std::string& location) {
             auto buffers = buffers_of(tensors);
             auto sig = signature_of(tensors);
             void* stream = current_stream(tensors);
             py::gil_scoped_release release;
             s.save(worker, name, sig, buffers, parse_location(location), stream);
           },
           py::arg("worker"), py::arg("name"), py::arg("tensors"), py::arg("location") = "host",
           "Copy tensors into the entry (worker, name). Asynchronous for CUDA tensors (see wait()).")
      .def("restore",
           [](ContextStore& s, int64_t worker, const std::string& name, const std::vector<at::Tensor>& tensors) {
             auto buffers = buffers_of(tensors);
             auto sig = signature_of(tensors);
             void* stream = current_stream(tensors);
             py::gil_scoped_release release;
             s.restore(worker, name, sig, buffers, stream);
           },
           py::arg("worker"), py::arg("name"), py::arg("tensors"),
           "Copy the entry back into tensors of the saved shape, dtype and device, in place.")
      .def("load",
           [](ContextStore& s, int64_t worker, const std::string& name) {
             std::vector<at::Tensor> out = empty_like_signature(s.signature(worker, name), s.device(worker, name));
             auto buffers = buffers_of(out);
             void* stream = current_stream(out);
             py::gil_scoped_release release;
             s.restore(worker, name, s.signature(worker, name), buffers, stream);
             return out;
           },
           py::arg("worker"), py::arg("name"), "New tensors holding the entry.")
      .def("order_after_saves",
           [](ContextStore& s, const std::vector<at::Tensor>& tensors) {
             void* stream = current_stream(tensors);
             if (!stream) return;  // host tensors: saves are synchronous
             int device = -1;
             for (const at::Tensor& t : tensors)
               if (t.is_cuda()) device = t.get_device();
             s.order_after_saves(device, stream);
           },
           py::arg("tensors"),
           "Make the tensors' current CUDA stream wait for every pending save: call before modifying "
           "saved tensors in place other than through restore().")
      .def("wait", &ContextStore::wait, py::call_guard<py::gil_scoped_release>(),
           "Block until every pending asynchronous save has landed.")
      .def("contains", &ContextStore::contains, py::arg("worker"), py::arg("name"))
      .def("workers", &ContextStore::workers)
      .def("names", &ContextStore::names, py::arg("worker"))
      .def("signature", &ContextStore::signature, py::arg("worker"), py::arg("name"))
      .def("erase", py::overload_cast<int64_t>(&ContextStore::erase), py::arg("worker"),
           "Drop a worker's entries; their memory is reused.")
      .def("erase", py::overload_cast<int64_t, const std::string&>(&ContextStore::erase), py::arg("worker"),
           py::arg("name"), "Drop one entry if present; its memory is reused.")
      .def("serialize",
           [](ContextStore& s, int64_t worker) {
             std::vector<uint8_t> bytes;
             {
               py::gil_scoped_release release;
               bytes = s.serialize(worker);
             }
             return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
           },
           py::arg("worker"), "A worker's whole context as checksummed bytes.")
      .def("deserialize",
           [](ContextStore& s, const py::bytes& data, int device) {
             std::string_view view = data;
             py::gil_scoped_release release;
             return s.deserialize(reinterpret_cast<const uint8_t*>(view.data()), static_cast<int64_t>(view.size()),
                                  device);
           },
           py::arg("data"), py::arg("device") = -1,
           "Load bytes from serialize(); returns the worker id. CUDA state goes to GPU `device` if given "
           "(the importing process's), else to the one it was saved from.")
      .def_property_readonly("capacity", &ContextStore::capacity)
      .def_property_readonly("reserved_bytes", &ContextStore::reserved_bytes)
      .def_property_readonly("slab_count", &ContextStore::slab_count);
}
