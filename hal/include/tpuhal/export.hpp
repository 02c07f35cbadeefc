// Symbol visibility: the library builds with hidden visibility and exports
// exactly what is marked TPUHAL_API.
#pragma once

#define TPUHAL_API __attribute__((visibility("default")))
