#include "gpu/cuda/cublaslt.h"

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace troupe::gpu::cuda {
namespace {

// The soname first (the executable's run path, LD_LIBRARY_PATH, ld.so's
// cache), then the toolkit's directory the build found (an installed troupe
// may carry no run path).
void* open_library(std::string* why) {
  const std::string soname = absl::StrCat("libcublasLt.so.", CUBLAS_VER_MAJOR);
  for (const std::string& path : {soname, absl::StrCat(TROUPE_CUDA_LIBRARY_DIR, "/", soname)}) {
    if (void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
    const char* err = dlerror();
    absl::StrAppend(why, why->empty() ? "" : "; ", err != nullptr ? err : path);
  }
  return nullptr;
}

template <typename F>
bool resolve(void* lib, const char* name, F* out, std::string* why) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out == nullptr) absl::StrAppend(why, why->empty() ? "" : ", ", name);
  return *out != nullptr;
}

struct Loaded {
  CublasLt api{};
  absl::Status status;
};

Loaded load() {
  Loaded l;
  std::string why;
  void* lib = open_library(&why);
  if (lib == nullptr) {
    l.status = absl::FailedPreconditionError(absl::StrCat("cannot open cuBLASLt: ", why));
    return l;
  }
  CublasLt& a = l.api;
  std::string missing;
  bool ok = true;
#define TROUPE_LT_SYMBOL(name) ok = resolve(lib, "cublasLt" #name, &a.name, &missing) && ok
  TROUPE_LT_SYMBOL(Create);
  TROUPE_LT_SYMBOL(Destroy);
  TROUPE_LT_SYMBOL(GetStatusName);
  TROUPE_LT_SYMBOL(GetStatusString);
  TROUPE_LT_SYMBOL(Matmul);
  TROUPE_LT_SYMBOL(MatmulAlgoGetHeuristic);
  TROUPE_LT_SYMBOL(MatmulDescCreate);
  TROUPE_LT_SYMBOL(MatmulDescDestroy);
  TROUPE_LT_SYMBOL(MatmulDescSetAttribute);
  TROUPE_LT_SYMBOL(MatmulPreferenceCreate);
  TROUPE_LT_SYMBOL(MatmulPreferenceDestroy);
  TROUPE_LT_SYMBOL(MatmulPreferenceSetAttribute);
  TROUPE_LT_SYMBOL(MatrixLayoutCreate);
  TROUPE_LT_SYMBOL(MatrixLayoutDestroy);
#undef TROUPE_LT_SYMBOL
  if (!ok) {
    l.status = absl::FailedPreconditionError(
        absl::StrCat("libcublasLt.so.", CUBLAS_VER_MAJOR, " lacks ", missing));
  }
  return l;  // (the library stays open for the process's life)
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

absl::StatusOr<const CublasLt*> load_cublaslt() {
  if (!loaded().status.ok()) return loaded().status;
  return &loaded().api;
}

}  // namespace troupe::gpu::cuda
