/* The C API from C99: a tiny layer on the CPU, a forward over caller memory, an error message. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "moekit/moekit_c.h"

enum { M = 3, H = 64, E = 8 }; /* the "tiny" preset: H = 64, E = 8 */

static DLTensor f32_matrix(float* data, int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 2;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = NULL; /* contiguous */
  return t;
}

int main(void) {
  moekit_layer_options options;
  moekit_layer_options_init(&options);
  options.dtype = "f32";
  options.device = "cpu";
  moekit_layer* layer = NULL;
  if (moekit_layer_create("tiny", 0, &options, &layer) != MOEKIT_OK) {
    fprintf(stderr, "moekit_layer_create: %s\n", moekit_last_error());
    return 1;
  }
  char* plan = NULL;
  moekit_layer_get_text(layer, MOEKIT_TEXT_BACKEND, &plan);
  printf("moekit %s, C API %d, backend %s\n", moekit_version(), moekit_c_api_version(), plan);
  moekit_string_free(plan);

  static float x[M * H], logits[M * E], out[M * H];
  for (int i = 0; i < M * H; ++i)
    x[i] = (float)((i % 17) - 8) / 8.0f;
  for (int i = 0; i < M * E; ++i)
    logits[i] = (float)((i * 7) % 11) / 11.0f;
  for (int i = 0; i < M * H; ++i)
    out[i] = NAN;
  int64_t x_shape[2] = {M, H}, logits_shape[2] = {M, E};
  DLTensor xt = f32_matrix(x, x_shape), lt = f32_matrix(logits, logits_shape);
  DLTensor ot = f32_matrix(out, x_shape);
  if (moekit_layer_forward(layer, &xt, &lt, &ot, NULL) != MOEKIT_OK) {
    fprintf(stderr, "moekit_layer_forward: %s\n", moekit_last_error());
    return 1;
  }
  for (int i = 0; i < M * H; ++i) {
    if (!isfinite(out[i])) {
      fprintf(stderr, "out[%d] = %f is not finite\n", i, out[i]);
      return 1;
    }
  }
  /* Errors come back as a status and the library's message; nothing aborts. */
  int64_t wrong_shape[2] = {M, H + 1};
  DLTensor wrong = f32_matrix(x, wrong_shape);
  const moekit_status status = moekit_layer_forward(layer, &wrong, &lt, &ot, NULL);
  if (status != MOEKIT_ERROR || strstr(moekit_last_error(), "hidden_states") == NULL) {
    fprintf(stderr, "expected an error naming hidden_states, got %d: %s\n", (int)status,
            moekit_last_error());
    return 1;
  }
  printf("forward ok (out[0] = %f); error: %s\n", out[0], moekit_last_error());
  moekit_layer_destroy(layer);
  return 0;
}
