// The fused CPU kernels as one translation unit (a unity build): ATen's headers are parsed once
// for the three kernels (and subnormals.cpp's control-register setter) instead of once each; bindings.cpp, the other unit, compiles beside it.
#include "fused_axis.cpp"
#include "fused_local.cpp"
#include "dropout.cpp"
#include "subnormals.cpp"
