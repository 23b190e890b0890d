// Sanitizer canary: leaks on purpose. tests/sanitizer_canary.cmake expects LeakSanitizer to
// report it, proving that the ASan job's "leaks fail the run" is really armed (LSan silently
// does nothing under ptrace or with detect_leaks=0).
#include <cstdio>

int* volatile g_sink = nullptr;

int main() {
  g_sink = new int[16];
  g_sink = nullptr;  // the only pointer is gone: a definite leak
  std::puts("leaked 64 bytes");
  return 0;
}
