"""Builds easyscale_ext._C with torch.utils.cpp_extension (ninja, incremental), and the scheduler's torch-free
easyscale_ext._search beside it; pyproject.toml has the rest.

EASYSCALE_CUDA=1 forces the CUDA kernels in (and fails if they cannot be built),
EASYSCALE_CUDA=0 forces a CPU-only build; unset, CUDA is used when the installed
torch has CUDA and nvcc is found. TORCH_CUDA_ARCH_LIST picks architectures
(default "8.0;9.0"). DEBUG=1 builds with -O0 -g.
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def locate_cuda_home():
    """Point torch at the real toolkit when nvcc on PATH is a wrapper script
    (torch would otherwise guess CUDA_HOME from the wrapper's folder)."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or not shutil.which("nvcc"):
        return
    with tempfile.TemporaryDirectory() as tmp:
        probe = os.path.join(tmp, "probe.cu")
        open(probe, "w").close()
        out = subprocess.run(["nvcc", "--dryrun", "-c", probe], capture_output=True, text=True, cwd=tmp)
    for line in (out.stdout + out.stderr).splitlines():
        if line.startswith("#$ TOP="):
            os.environ["CUDA_HOME"] = os.path.realpath(line.split("=", 1)[1].strip())
            return


def want_cuda():
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    choice = os.environ.get("EASYSCALE_CUDA", "auto").strip().lower()
    if choice not in ("0", "1", "auto"):
        sys.exit(f"EASYSCALE_CUDA must be 0, 1 or unset, got {choice!r}")
    have = torch.version.cuda is not None and CUDA_HOME is not None and (
        shutil.which("nvcc") or os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")))
    if choice == "1" and not have:
        sys.exit("EASYSCALE_CUDA=1 but CUDA kernels cannot be built: need a CUDA-enabled torch "
                 f"(torch.version.cuda={torch.version.cuda}) and nvcc (CUDA_HOME={CUDA_HOME}). "
                 "Install torch with CUDA and the CUDA toolkit, or set EASYSCALE_CUDA=0.")
    return have if choice == "auto" else choice == "1"


def shared_libstdcxx():
    """Link flags that give _C the shared libstdc++, as torch has. A compiler whose libstdc++ is an archive only
    (some GPU machines' images set CXX to one) links a private copy into _C, whose symbols interpose with
    torch's: the first stream output in _C then crashes (an uninitialised locale facet)."""
    from torch.utils.cpp_extension import get_cxx_compiler

    found = subprocess.run([get_cxx_compiler(), "-print-file-name=libstdc++.so"], capture_output=True,
                           text=True).stdout.strip()
    return [] if os.path.isabs(found) else ["-Wl,--no-as-needed", "-l:libstdc++.so.6"]


def extension():
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    debug = os.environ.get("DEBUG", "0") == "1"
    opt = ["-O0", "-g"] if debug else ["-O3"]
    # No FMA contraction or fast math: the reductions must round exactly as
    # written, identically under g++ and nvcc.
    cxx = opt + ["-fopenmp", "-ffp-contract=off", "-fno-fast-math"]
    sources = sorted(glob.glob("csrc/core/*.cpp")) + sorted(glob.glob("csrc/torch/*.cpp"))
    link = ["-fopenmp"] + shared_libstdcxx()
    if want_cuda():
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
        sources = [s for s in sources if not s.endswith("device_backend_none.cpp")]
        sources += sorted(glob.glob("csrc/core/cuda/*.cu")) + sorted(glob.glob("csrc/torch/cuda/*.cpp"))
        nvcc = opt + ["--fmad=false", "-Xcompiler", "-ffp-contract=off"]
        return CUDAExtension("easyscale_ext._C", sources, extra_compile_args={"cxx": cxx, "nvcc": nvcc},
                             extra_link_args=link)
    return CppExtension("easyscale_ext._C", sources, extra_compile_args={"cxx": cxx}, extra_link_args=link)


def search_extension():
    """The scheduler's compiled search: numpy in and out, no libtorch (the simulator does not import torch)."""
    import pybind11

    return Extension("easyscale_ext._search", sorted(glob.glob("csrc/sched/*.cpp")),
                     include_dirs=[pybind11.get_include()], language="c++", extra_compile_args=["-O3", "-std=c++17"],
                     extra_link_args=shared_libstdcxx())


def main():
    locate_cuda_home()
    from torch.utils.cpp_extension import BuildExtension

    class IncrementalBuildExt(BuildExtension.with_options(use_ninja=True)):
        """Keeps ninja's objects in build/ext, so `pip install -e .` (which
        otherwise builds in a fresh temporary folder) recompiles only what changed."""

        def finalize_options(self):
            super().finalize_options()
            self.build_temp = os.path.join(HERE, "build", "ext")

    # Metadata, dependencies and the entry point are in pyproject.toml; this file builds the extension only.
    setup(ext_modules=[extension(), search_extension()], cmdclass={"build_ext": IncrementalBuildExt})


if __name__ == "__main__":
    main()
