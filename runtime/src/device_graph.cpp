#include "device_graph.hpp"

#include <algorithm>
#include <limits>

#include "tpuhal/error.hpp"

namespace tpuhal::rt::detail {
namespace {

using nlohmann::json;

constexpr std::uint64_t kMaxDim = std::uint64_t{1} << 32;
constexpr std::size_t kMaxTensors = 1u << 20;

[[noreturn]] void damaged(std::string_view name, const std::string& section, const std::string& what) {
  throw Error(Status::InvalidArgument, std::string(name) + ": the " + section + " section is damaged: " + what);
}

std::vector<std::byte> to_bytes(const json& j) {
  const std::string s = j.dump(1);
  std::vector<std::byte> out(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) out[i] = static_cast<std::byte>(s[i]);
  return out;
}

json parse(std::span<const std::byte> bytes, std::string_view name, const std::string& section) {
  const auto* p = reinterpret_cast<const char*>(bytes.data());
  json j = json::parse(p, p + bytes.size(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) damaged(name, section, "not a JSON object");
  return j;
}

// Checked readers: each names the field it wanted.
struct Reader {
  std::string_view name;
  std::string section;
  std::string lead;  // what each message starts with ("the stage for batch 2: ")
  const json& field(const json& o, const std::string& key, const std::string& where) const {
    if (!o.is_object()) damaged(name, section, lead + where + " is not an object");
    auto it = o.find(key);
    if (it == o.end()) damaged(name, section, lead + where + " has no '" + key + "'");
    return *it;
  }
  std::int64_t integer(const json& o, const std::string& key, const std::string& where) const {
    const json& v = field(o, key, where);
    if (!v.is_number_integer()) damaged(name, section, lead + where + "." + key + " is not an integer");
    return v.get<std::int64_t>();
  }
  std::uint64_t count(const json& o, const std::string& key, const std::string& where) const {
    const json& v = field(o, key, where);
    if (!v.is_number_unsigned()) damaged(name, section, lead + where + "." + key + " is not a non-negative integer");
    return v.get<std::uint64_t>();
  }
  std::string text(const json& o, const std::string& key, const std::string& where) const {
    const json& v = field(o, key, where);
    if (!v.is_string()) damaged(name, section, lead + where + "." + key + " is not a string");
    return v.get<std::string>();
  }
  const json& array(const json& o, const std::string& key, const std::string& where) const {
    const json& v = field(o, key, where);
    if (!v.is_array()) damaged(name, section, lead + where + "." + key + " is not an array");
    return v;
  }
  DType dtype(const json& o, const std::string& where) const {
    const std::string t = text(o, "dtype", where);
    for (DType d : {DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32})
      if (t == to_string(d)) return d;
    damaged(name, section, lead + where + " has dtype '" + printable(t) + "'");
  }
  std::vector<std::int64_t> shape(const json& o, const std::string& where) const {
    const json& a = array(o, "shape", where);
    if (a.size() > kMaxRank) damaged(name, section, lead + where + " has rank " + std::to_string(a.size()));
    std::vector<std::int64_t> s;
    std::uint64_t n = 1;
    for (const auto& d : a) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() >= kMaxDim)
        damaged(name, section, lead + where + " has a dimension that is not an integer in [0, 2^32)");
      s.push_back(d.get<std::int64_t>());
      n *= d.get<std::uint64_t>();
      if (n >= (std::uint64_t{1} << 40)) damaged(name, section, lead + where + " has more than 2^40 elements");
    }
    return s;
  }
};

// size_of(DType) without the op library (the fuzz target links less).
std::uint64_t element_bytes(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::I8:
    case DType::U8: return 1;
  }
  return 1;
}

std::uint64_t product(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 64)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > 64) out += "...";
  return out;
}

std::uint64_t align64(std::uint64_t v) noexcept { return (v + 63) / 64 * 64; }
const char* dtype_name(DType t) noexcept { return to_string(t); }

std::uint64_t DTensor::elements() const { return product(shape); }
std::uint64_t DTensor::bytes() const { return elements() * element_bytes(dtype); }

namespace {
// Whether its elements lie in row-major order with no gaps (the stride of
// an axis of one element does not matter, nor any of a tensor of none).
// Unsigned: the shape of a tensor of elements was checked against its
// span, and a product that wraps only makes a stride differ.
bool row_major(const DTensor& t) {
  if (t.strides.empty() || t.elements() == 0) return true;
  if (t.strides.size() != t.shape.size()) return false;
  std::uint64_t expected = 1;
  for (std::size_t i = t.shape.size(); i-- > 0;) {
    if (t.shape[i] != 1 && static_cast<std::uint64_t>(t.strides[i]) != expected) return false;
    expected *= static_cast<std::uint64_t>(t.shape[i]);
  }
  return true;
}
}  // namespace
std::uint64_t DTensor::span() const {
  if (strides.empty() || elements() == 0) return bytes();
  // Saturates at UINT64_MAX: any shape and strides a damaged file holds
  // then fail the bounds check.
  std::uint64_t last = 0, bytes = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    std::uint64_t term = 0;
    if (__builtin_mul_overflow(static_cast<std::uint64_t>(shape[i] - 1), static_cast<std::uint64_t>(strides[i]),
                               &term) ||
        __builtin_add_overflow(last, term, &last))
      return UINT64_MAX;
  }
  if (__builtin_mul_overflow(last + 1, std::uint64_t{element_bytes(dtype)}, &bytes)) return UINT64_MAX;
  return bytes;
}

std::int64_t DeviceGraph::add_arena(std::string value, DType dtype, std::vector<std::int64_t> shape) {
  DTensor t;
  t.value = std::move(value);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.storage = Storage::Arena;
  t.offset = align64(arena_bytes);
  arena_bytes = t.offset + t.bytes();
  tensors.push_back(std::move(t));
  return static_cast<std::int64_t>(tensors.size() - 1);
}

std::uint64_t DeviceGraph::share_arena() {
  // A group: the arena tensors at one offset (a tensor and its views; every
  // add_arena tensor with bytes has an offset of its own).
  struct Group {
    std::uint64_t bytes = 0;
    std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = -1;
    std::uint64_t offset = 0;
  };
  std::map<std::uint64_t, Group> groups;
  // A subview belongs to its base's group, `within` bytes into it.
  auto key = [&](const DTensor& t) {
    return t.base >= 0 ? tensors[static_cast<std::size_t>(t.base)].offset : t.offset;
  };
  for (const auto& t : tensors)
    if (t.storage == Storage::Arena && t.bytes() > 0)
      groups[key(t)].bytes = std::max(groups[key(t)].bytes, t.offset - key(t) + t.span());
  auto use = [&](std::int64_t tensor, std::int64_t at) {
    const auto& t = tensors.at(static_cast<std::size_t>(tensor));
    if (t.storage != Storage::Arena || t.bytes() == 0) return;
    Group& gr = groups[key(t)];
    gr.first = std::min(gr.first, at);
    gr.last = std::max(gr.last, at);
  };
  for (std::size_t i = 0; i < ops.size(); ++i)
    for (const auto& [role, tensor] : ops[i].operands) use(tensor, static_cast<std::int64_t>(i));
  const auto end = static_cast<std::int64_t>(ops.size());
  // Inputs stay intact for the whole run (a program submitted again reads
  // them again); outputs hold until the end.
  for (auto t : inputs) use(t, -1), use(t, end);
  for (auto t : outputs) use(t, end);
  for (auto& [_, gr] : groups)
    if (gr.last < 0 && gr.first > end) gr.first = -1, gr.last = end;  // unused: kept whole

  // Largest first, each at the lowest offset clear of the placed groups it
  // lives alongside.
  std::vector<Group*> order;
  for (auto& [_, gr] : groups) order.push_back(&gr);
  std::stable_sort(order.begin(), order.end(), [](const Group* a, const Group* b) { return a->bytes > b->bytes; });
  std::vector<const Group*> placed;
  std::uint64_t size = 0;
  for (Group* gr : order) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> busy;  // [begin, end) of overlapping lifetimes
    for (const Group* o : placed)
      if (o->first <= gr->last && gr->first <= o->last) busy.emplace_back(o->offset, o->offset + o->bytes);
    std::sort(busy.begin(), busy.end());
    std::uint64_t at = 0;
    for (const auto& [b, e] : busy) {
      if (at + gr->bytes <= b) break;
      at = std::max(at, align64(e));
    }
    gr->offset = at;
    size = std::max(size, at + gr->bytes);
    placed.push_back(gr);
  }
  const std::uint64_t before = arena_bytes;
  std::vector<std::uint64_t> placed_at(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (t.storage == Storage::Arena && t.bytes() > 0) placed_at[i] = groups.at(key(t)).offset + (t.offset - key(t));
  }
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].storage == Storage::Arena) tensors[i].offset = placed_at[i];
  arena_bytes = align64(size);
  return before;
}

std::int64_t DeviceGraph::add_view(std::int64_t of, std::vector<std::int64_t> shape) {
  DTensor t = tensors.at(static_cast<std::size_t>(of));
  t.shape = std::move(shape);
  t.value.clear();
  tensors.push_back(std::move(t));
  return static_cast<std::int64_t>(tensors.size() - 1);
}

std::int64_t DeviceGraph::add_subview(std::int64_t of, std::vector<std::int64_t> shape,
                                      std::vector<std::int64_t> strides, std::uint64_t byte_offset) {
  DTensor t = tensors.at(static_cast<std::size_t>(of));
  if (t.storage != Storage::Arena) throw std::logic_error("add_subview of a weight");
  if (t.base < 0) t.base = of;
  t.offset += byte_offset;
  t.shape = std::move(shape);
  t.strides = std::move(strides);
  t.value.clear();
  tensors.push_back(std::move(t));
  return static_cast<std::int64_t>(tensors.size() - 1);
}

namespace {

json graph_json(const DeviceGraph& g) {
  json j;
  j["arena_bytes"] = g.arena_bytes;
  j["weight_bytes"] = g.weight_bytes;
  json ts = json::array();
  for (const auto& t : g.tensors) {
    json e;
    e["dtype"] = to_string(t.dtype);
    e["shape"] = t.shape;
    e["storage"] = t.storage == Storage::Weights ? "weights" : "arena";
    e["offset"] = t.offset;
    if (!t.strides.empty()) e["strides"] = t.strides;
    if (!t.value.empty()) e["value"] = t.value;
    ts.push_back(std::move(e));
  }
  j["tensors"] = std::move(ts);
  json os = json::array();
  for (const auto& op : g.ops) {
    json e;
    e["op"] = op.kind;
    if (!op.node.empty()) e["node"] = op.node;
    e["operands"] = op.operands;
    e["attrs"] = op.attrs;
    if (op.global) e["global"] = true;
    os.push_back(std::move(e));
  }
  j["ops"] = std::move(os);
  j["inputs"] = g.inputs;
  j["outputs"] = g.outputs;
  return j;
}

DeviceGraph graph_from_json(const json& j, std::uint64_t weight_bytes, std::string_view name,
                            const std::string& section, const std::string& lead) {
  const Reader r{name, section, lead};
  auto bad = [&](const std::string& what) { damaged(name, section, lead + what); };
  DeviceGraph g;
  g.arena_bytes = r.count(j, "arena_bytes", "the graph");
  g.weight_bytes = r.count(j, "weight_bytes", "the graph");
  if (g.arena_bytes > (std::uint64_t{1} << 40)) bad("the arena size is over 1 TiB");
  if (g.weight_bytes != weight_bytes)
    bad("it expects " + std::to_string(g.weight_bytes) + " bytes of weights; the weights section has " +
        std::to_string(weight_bytes));
  const json& ts = r.array(j, "tensors", "the graph");
  if (ts.size() > kMaxTensors) bad("it has " + std::to_string(ts.size()) + " tensors");
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const std::string where = "tensor " + std::to_string(i);
    DTensor t;
    t.dtype = r.dtype(ts[i], where);
    t.shape = r.shape(ts[i], where);
    const std::string storage = r.text(ts[i], "storage", where);
    if (storage != "weights" && storage != "arena") bad(where + " has storage '" + printable(storage) + "'");
    t.storage = storage == "weights" ? Storage::Weights : Storage::Arena;
    t.offset = r.count(ts[i], "offset", where);
    if (ts[i].contains("value")) t.value = r.text(ts[i], "value", where);
    if (ts[i].contains("strides")) {
      const json& st = ts[i]["strides"];
      if (!st.is_array() || st.size() != t.shape.size()) bad(where + " has strides that are not one per dimension");
      for (const auto& v : st) {
        if (!v.is_number_unsigned() || v.get<std::uint64_t>() >= (std::uint64_t{1} << 32))
          bad(where + " has a stride that is not an integer in [0, 2^32)");
        t.strides.push_back(v.get<std::int64_t>());
      }
    }
    const std::uint64_t limit = t.storage == Storage::Weights ? weight_bytes : g.arena_bytes;
    if (t.offset % element_bytes(t.dtype) != 0) bad(where + " is misaligned");
    if (t.offset > limit || t.span() > limit - t.offset)
      bad(where + " (" + std::to_string(t.span()) + " bytes at offset " + std::to_string(t.offset) +
          ") lies outside the " + storage + " (" + std::to_string(limit) + " bytes)");
    g.tensors.push_back(std::move(t));
  }
  auto index = [&](const json& v, const std::string& where) {
    if (!v.is_number_unsigned() || v.get<std::uint64_t>() >= g.tensors.size())
      bad(where + " names no tensor (there are " + std::to_string(g.tensors.size()) + ")");
    return v.get<std::int64_t>();
  };
  const json& os = r.array(j, "ops", "the graph");
  for (std::size_t i = 0; i < os.size(); ++i) {
    const std::string where = "op " + std::to_string(i);
    DOp op;
    op.kind = printable(r.text(os[i], "op", where));
    if (os[i].contains("node")) op.node = printable(r.text(os[i], "node", where));
    const json& operands = r.field(os[i], "operands", where);
    if (!operands.is_object()) bad(where + ".operands is not an object");
    for (const auto& [role, v] : operands.items()) op.operands[role] = index(v, where + " operand " + printable(role));
    op.attrs = r.field(os[i], "attrs", where);
    if (!op.attrs.is_object()) bad(where + ".attrs is not an object");
    const json& global = os[i].contains("global") ? os[i]["global"] : json(false);
    if (!global.is_boolean()) bad(where + ".global is not true or false");
    op.global = global.get<bool>();
    g.ops.push_back(std::move(op));
  }
  for (const char* key : {"inputs", "outputs"}) {
    auto& list = std::string(key) == "inputs" ? g.inputs : g.outputs;
    for (const auto& v : r.array(j, key, "the graph")) {
      const auto t = index(v, std::string("an entry of ") + key);
      // f32 (inputs also i32: a model's integer inputs), in the arena.
      const DTensor& dt = g.tensors[static_cast<std::size_t>(t)];
      const bool typed = dt.dtype == DType::F32 || (dt.dtype == DType::I32 && &list == &g.inputs);
      if (dt.storage != Storage::Arena || !typed)
        bad(std::string("an entry of ") + key + " is not an f32" + (&list == &g.inputs ? " or i32" : "") +
            " tensor in the arena");
      // The caller's bytes go in and come out as one row-major block.
      if (!row_major(dt))
        bad(std::string("an entry of ") + key + " (tensor " + std::to_string(t) +
            ") is a strided view; inputs and outputs are whole row-major tensors");
      list.push_back(t);
    }
  }
  return g;
}

}  // namespace

std::vector<std::byte> encode_graph(const DeviceGraph& g) { return to_bytes(graph_json(g)); }

DeviceGraph decode_graph(std::span<const std::byte> bytes, std::uint64_t weight_bytes, std::string_view name) {
  return graph_from_json(parse(bytes, name, "graph"), weight_bytes, name, "graph", "");
}

std::vector<std::byte> encode_stages(const std::vector<Stage>& stages) {
  json a = json::array();
  for (const Stage& s : stages) a.push_back({{"batch", s.batch}, {"graph", graph_json(s.graph)}});
  return to_bytes(json{{"stages", std::move(a)}});
}

std::vector<Stage> decode_stages(std::span<const std::byte> bytes, std::uint64_t weight_bytes, std::string_view name) {
  const json j = parse(bytes, name, "stages");
  const Reader r{name, "stages", ""};
  std::vector<Stage> out;
  const json& a = r.array(j, "stages", "the stages section");
  if (a.size() > kMaxStages) damaged(name, "stages", "it has " + std::to_string(a.size()) + " stages");
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string where = "stage " + std::to_string(i);
    Stage s;
    s.batch = r.integer(a[i], "batch", where);
    const std::string lead = "the stage for batch " + std::to_string(s.batch) + ": ";
    s.graph = graph_from_json(r.field(a[i], "graph", where), weight_bytes, name, "stages", lead);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::byte> encode_io(const std::vector<TensorSpec>& inputs, const std::vector<TensorSpec>& outputs) {
  json j;
  for (const auto* list : {&inputs, &outputs}) {
    json a = json::array();
    for (const auto& s : *list) a.push_back({{"name", s.name}, {"dtype", to_string(s.dtype)}, {"shape", s.shape}});
    j[list == &inputs ? "inputs" : "outputs"] = std::move(a);
  }
  return to_bytes(j);
}

void decode_io(std::span<const std::byte> bytes, std::string_view name, std::vector<TensorSpec>& inputs,
               std::vector<TensorSpec>& outputs) {
  const json j = parse(bytes, name, "io");
  const Reader r{name, "io", ""};
  for (const char* key : {"inputs", "outputs"}) {
    auto& list = std::string(key) == "inputs" ? inputs : outputs;
    const json& a = r.array(j, key, "the io section");
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::string where = std::string(key) + " " + std::to_string(i);
      TensorSpec s;
      s.name = r.text(a[i], "name", where);
      s.dtype = r.dtype(a[i], where);
      s.shape = r.shape(a[i], where);
      // Inputs are f32, or i32 for a model's integer inputs (token ids); outputs f32.
      if (s.dtype != DType::F32 && (s.dtype != DType::I32 || &list == &outputs))
        damaged(name, "io", where + " is " + to_string(s.dtype) + ", not f32" + (&list == &inputs ? " or i32" : ""));
      list.push_back(std::move(s));
    }
  }
}

}  // namespace tpuhal::rt::detail
