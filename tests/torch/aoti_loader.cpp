// Loads an AOTInductor package with no Python in the process (tests/torch/test_aoti.py):
//   aoti_loader PACKAGE [LIBRARY...]
// Each LIBRARY (e.g. fuselet's libfuselet_torch.so, which registers the C++ ops) is dlopen'ed
// first. Prints "loaded" and exits 0, or prints the loader's error and exits 1.
#include <dlfcn.h>

#include <iostream>

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: aoti_loader PACKAGE [LIBRARY...]\n";
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    if (dlopen(argv[i], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      std::cerr << dlerror() << "\n";
      return 2;
    }
  }
  try {
    torch::inductor::AOTIModelPackageLoader loader(argv[1]);
    std::cout << "loaded\n";
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
