// Every kernel family's parameters and bodies (kernel.h), for kernels.cu
// and host_kernels.cpp alike.
#pragma once

#include "activation.h"
#include "elementwise.h"
#include "linear.h"
#include "quantized.h"
#include "selection.h"
