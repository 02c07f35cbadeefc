// libgsttpuhal.so: registers tpuhaldec, tpuhalconvert and tpuhalinfer.
// Nothing here opens a device: gst-plugin-scanner loads the plugin only to
// list what it has.
#include <gst/gst.h>

#include "elements.h"

GST_DEBUG_CATEGORY(tpuhal_debug);

namespace {

gboolean plugin_init(GstPlugin* plugin) {
  GST_DEBUG_CATEGORY_INIT(tpuhal_debug, "tpuhal", 0, "tpuhal elements");
  // Rank none: decodebin does not pick the board's decoder on its own.
  return gst_element_register(plugin, "tpuhaldec", GST_RANK_NONE, tpuhal_dec_get_type()) &&
         gst_element_register(plugin, "tpuhalconvert", GST_RANK_NONE, tpuhal_convert_get_type()) &&
         gst_element_register(plugin, "tpuhalinfer", GST_RANK_NONE, tpuhal_infer_get_type());
}

}  // namespace

GST_PLUGIN_DEFINE(GST_VERSION_MAJOR, GST_VERSION_MINOR, tpuhal,
                  "Video decode, conversion and inference on tpuhal boards", plugin_init, VERSION, "Proprietary",
                  "tpuhal", "the tpuhal project")
