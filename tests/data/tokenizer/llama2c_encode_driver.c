#define TESTING
#include "run.c"
// Reads NUL-terminated prompts from stdin; prints the ids of encode(text, bos=1, eos=0), one line each.
int main(int argc, char** argv) {
  Tokenizer t;
  build_tokenizer(&t, argv[1], 512);
  static char buf[1 << 16];
  size_t n = 0;
  int c;
  int* toks = malloc(sizeof(int) * (1 << 17));
  while ((c = getchar()) != EOF) {
    if (c != 0) { buf[n++] = (char)c; continue; }
    buf[n] = 0;
    int nt = 0;
    encode(&t, buf, 1, 0, toks, &nt);
    for (int i = 0; i < nt; i++) printf(i ? " %d" : "%d", toks[i]);
    printf("\n");
    n = 0;
  }
  return 0;
}
