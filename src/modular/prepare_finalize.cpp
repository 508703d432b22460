#include "moekit/modular/prepare_finalize.h"

#include "moekit/core/error.h"

namespace moekit {

AsyncHandle<PrepareResult> PrepareFinalizeModular::prepare_async(const PrepareArgs& args,
                                                                 RunContext ctx) {
  MOEKIT_CHECK(supports_async(), "{} does not implement prepare_async (supports_async() is false)",
               name());
  return {{}, [this, args, ctx] { return prepare(args, ctx); }};
}

AsyncHandle<void> PrepareFinalizeModular::finalize_async(const FinalizeArgs& args, RunContext ctx) {
  MOEKIT_CHECK(supports_async(), "{} does not implement finalize_async (supports_async() is false)",
               name());
  return {{}, [this, args, ctx] { finalize(args, ctx); }};
}

}  // namespace moekit
