// Sanitizer canary: signed overflow on purpose. tests/sanitizer_canary.cmake expects UBSan to
// report it and the process to fail (-fno-sanitize-recover), proving UB cannot pass silently.
#include <climits>
#include <cstdio>
#include <cstdlib>

int main(int argc, char**) {
  volatile int x = INT_MAX;
  const int y = x + argc;  // argc >= 1: overflows
  std::printf("%d\n", y);
  return 0;
}
