// The table of op handlers (handler.hpp), gathered from the families'
// files (families.inc) once.
#include <algorithm>
#include <map>

#include "onnx/handler.hpp"
#include "tpuhal/error.hpp"

namespace tpuhal::rt::detail {

#define TPUHAL_ONNX_FAMILY(name) std::span<const OpHandler> name##_handlers();
#include "onnx/families.inc"
#undef TPUHAL_ONNX_FAMILY

namespace {

// A handler every part of the compiler can use: a shape rule, a fold or an
// expansion; a fold where it says it folds; a lowering where it reaches the
// device.
void check(const OpHandler& h) {
  const std::string op(h.ops.empty() ? "(none)" : h.ops.front());
  auto refuse = [&](const char* what) {
    throw Error(Status::Internal, "compiler: the handler of ONNX op " + op + " " + what);
  };
  if (h.ops.empty()) refuse("names no op");
  if (!h.infer && !h.fold && !h.expand) refuse("has no shape rule, fold or expansion");
  if ((h.folds != Fold::Never) != (h.fold != nullptr)) refuse("has a fold without saying when, or the reverse");
  if (h.infer && !h.lower) refuse("has a shape rule but no lowering");
  if ((h.activation != nullptr) != (h.fuse != Fuse::No)) refuse("has an activation without saying how it fuses");
}

struct Registry {
  std::vector<const OpHandler*> all;
  std::map<std::string_view, const OpHandler*, std::less<>> by_op;
};

const Registry& registry() {
  static const Registry r = [] {
    Registry reg;
    for (auto family : {
#define TPUHAL_ONNX_FAMILY(name) name##_handlers,
#include "onnx/families.inc"
#undef TPUHAL_ONNX_FAMILY
         })
      for (const OpHandler& h : family()) {
        check(h);
        reg.all.push_back(&h);
        for (auto op : h.ops)
          if (!reg.by_op.emplace(op, &h).second)
            throw Error(Status::Internal, "compiler: two handlers for ONNX op " + std::string(op));
      }
    return reg;
  }();
  return r;
}

std::vector<std::string> ops_where(bool (*keep)(const OpHandler&)) {
  std::vector<std::string> out;
  for (const auto& [op, h] : registry().by_op)
    if (keep(*h)) out.emplace_back(op);
  return out;
}

}  // namespace

const OpHandler* find_handler(std::string_view op) {
  const auto& m = registry().by_op;
  auto it = m.find(op);
  return it == m.end() ? nullptr : it->second;
}

std::span<const OpHandler* const> handlers() { return registry().all; }

std::vector<std::string> supported_ops() {
  return ops_where([](const OpHandler&) { return true; });
}

std::vector<std::string> foldable_ops() {
  return ops_where([](const OpHandler& h) { return h.fold != nullptr && h.folds != Fold::Never; });
}

}  // namespace tpuhal::rt::detail

namespace tpuhal::rt {

std::vector<std::string> supported_onnx_ops() { return detail::supported_ops(); }
std::vector<std::string> foldable_onnx_ops() { return detail::foldable_ops(); }

}  // namespace tpuhal::rt
