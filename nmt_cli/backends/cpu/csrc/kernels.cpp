// Every kernel of the module in one translation unit, built beside the other one
// (decoder_step.cpp, with the Python bindings). Most of a kernel file's compile time is
// reading ATen's headers; one unit reads them once instead of once a file, which makes a
// first build several times cheaper (BENCHMARKS.md). Each file stays a unit of its own for
// a reader and compiles alone; the helpers each keeps in an anonymous namespace share
// one here, so their names differ from file to file.
#include "attention.cpp"
#include "attention_train.cpp"
#include "beam_choose.cpp"
#include "beam_topk.cpp"
#include "bf16_linear.cpp"
#include "bias_relu.cpp"
#include "cpu_level.cpp"
#include "dropout_mask.cpp"
#include "fp32_linear.cpp"
#include "int8_linear.cpp"
#include "log_softmax.cpp"
#include "smoothed_loss.cpp"
