// The plugin's element types (plugin.cpp registers them).
#pragma once
#include <gst/gst.h>

GType tpuhal_dec_get_type();
GType tpuhal_convert_get_type();
GType tpuhal_infer_get_type();

// Every element logs under the "tpuhal" debug category (GST_DEBUG=tpuhal:5).
GST_DEBUG_CATEGORY_EXTERN(tpuhal_debug);
