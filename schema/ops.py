# The tensor op schema: every fact about an op kind and the enumerations its
# attributes use, written once. schema/generate.py expands it into each
# layer's own folder (the list is in generate.py's OUTPUTS); the
# Schema.GeneratedFilesAreCurrent test fails when a generated file differs
# from what this file says. docs/adding-an-op.md walks through a new kind.
#
# Kinds and enumeration values are part of the versioned firmware
# interface: never renumber or reuse a code, add new ones at the end, and
# give each the interface minor it came in (MINORS below says what each
# minor added).

# ---- interface minors ------------------------------------------------------
#
# What each minor of the firmware interface added, in order from 1.1; the
# last is the interface this tree implements (fw::kInterfaceVersion). A new
# kind or attribute value names its minor below; a minor that adds none
# (a register, a status) is a line here too. The generator writes
# fw/version.inc and the list in docs/firmware-interface.md from this, and
# refuses a kind or value of a minor not listed. (minor, what it added,
# what a board of the minor before lacks).
MINORS = [
    (1, "tensor ops and calls (kTensorOp, kCall, kCapTensor)", "tensor ops"),
    (2, "the video engine (video.h: kVideoOpen, kVideoDecode, kVideoClose, reg::kVideoDoorbell, kCapVideoDecode)",
     "video decoder"),
    (3, "the elementwise mode ElementwiseOp::kErf (op_enums.inc)", "elementwise erf"),
    (4, "the activation Activation::kHardSwish (op_enums.inc)", "hard swish activation"),
    (5, "the op kinds kTopK, kConvTranspose2d and kWhere (op_kinds.inc)", "top_k, conv_transpose2d or where"),
    (6, "the telemetry block (telemetry.h: MboxCmd::kTelemetry, kCapTelemetry)", "telemetry block"),
    (7, "the elementwise comparisons and logic, ElementwiseOp::kEqual to kNot (op_enums.inc)",
     "elementwise comparisons or logic"),
    (8, "the status kOutOfMemory (status.h), with the codec unit's bounds (video.h: kMaxVideoPendingPackets); "
     "a board speaking to an older driver reports what 1.8 calls kOutOfMemory as kBadArgument (a command) or "
     "kCorruptStream (a frame record)", "out-of-memory status"),
    (9, "the modelled board clock (kCapModelledTime: timestamps and the TIME registers keep the board's timing "
     "model's time, timing.h)", "modelled board clock"),
    (10, "the elementwise modes ElementwiseOp::kCeil, kFloor and kRound (op_enums.inc)", "elementwise ceil, floor or round"),
    (11, "the op kind kGather (op_kinds.inc, GatherAttrs in op_attrs.inc)", "gather"),
    (12, "the op kind kQLinearAdd (op_kinds.inc), and u8 and i8 indices for kGather (a table lookup: each byte "
     "picks one of 256 entries)", "qlinear_add or gather by byte indices"),
    (13, "the op kind kCumSum (op_kinds.inc, CumSumAttrs in op_attrs.inc)", "cumsum"),
    (14, "the elementwise modes ElementwiseOp::kMod and kFmod (op_enums.inc)", "elementwise mod or fmod"),
    (15, "the op kind kNms (op_kinds.inc, NmsAttrs in op_attrs.inc)", "nms"),
    (16, "the op kind kScatterElements (op_kinds.inc, ScatterElementsAttrs in op_attrs.inc, ScatterReduction in "
     "op_enums.inc)", "scatter_elements"),
    (17, "the elementwise modes ElementwiseOp::kSin to kAtanh, the trigonometric and hyperbolic functions and "
     "their inverses (op_enums.inc)", "elementwise trigonometric or hyperbolic functions"),
    (18, "OpHeader::flags with kOpGlobal (tensor.h): an op the program runs on its own, DDR to DDR; a placement "
     "the timing model charges, which changes no result (a driver leaves the flags out for a board of 1.17, "
     "which refuses them as reserved words)", "op flags"),
    (19, "the op kind kQLinearMul (op_kinds.inc)", "qlinear_mul"),
    (20, "the op kind kQLinearGlobalAvgPool (op_kinds.inc)", "qlinear_global_avg_pool"),
    (21, "the opcode kWaitTime (command.h: a queue's next command starts no earlier than a board time), and the "
     "board time the codec unit finished each frame in its kFrame record (video.h: frame_done_ns)",
     "timed waits and frame times"),
    (22, "the op kind kRoiAlign (op_kinds.inc, RoiAlignAttrs in op_attrs.inc, RoiAlignMode in op_enums.inc)",
     "roi_align"),
    (23, "ConvAttrs::accumulate (op_attrs.inc): a float kConv2d adds its result to what Y holds, before the "
     "activation (a residual connection's Add fused into the convolution before it)", "accumulating convolutions"),
]

# ---- enumerations of op attributes ----------------------------------------
#
# One entry per enumeration: its C++ name, the layers it is declared in
# ("fw": tpuhal::fw, numbered on the wire as uint32; "hal": the public API,
# tpuhal::, uint8; "driver": tpuhal::driver, uint8), and its values in code
# order: (Name, "name", minor, comment). The HAL's enumerator is Name, the
# firmware's kName; "name" is what the tools, Python and the model file
# call it. Codes are the position in the list.
ENUMS = [
    dict(
        name="Activation",
        layers=("fw", "hal"),
        doc="Activation fused after matmul and convolution (and the unary maps).",
        values=[
            ("None", "none", 1, ""),
            ("Relu", "relu", 1, ""),
            ("Clip", "clip", 1, "clamp to [alpha, beta]; relu6 is clip(0, 6)"),
            ("Sigmoid", "sigmoid", 1, ""),
            ("Silu", "silu", 1, "x * sigmoid(x)"),
            ("LeakyRelu", "leaky_relu", 1, "x < 0 ? alpha * x : x"),
            ("Tanh", "tanh", 1, ""),
            ("HardSigmoid", "hard_sigmoid", 1, "clamp(alpha * x + beta, 0, 1)"),
            ("HardSwish", "hard_swish", 4, "x * clamp(alpha * x + beta, 0, 1)"),
        ],
    ),
    dict(
        name="Layout",
        layers=("fw", "hal"),
        doc="Layout of a 4-D activation tensor.",
        values=[("NCHW", "nchw", 1, ""), ("NHWC", "nhwc", 1, "")],
    ),
    dict(
        name="PoolKind",
        layers=("fw",),
        doc="Max or average pooling.",
        values=[("Max", "max", 1, ""), ("Average", "average", 1, "")],
    ),
    dict(
        name="ElementwiseOp",
        layers=("fw", "driver"),
        doc="The map of an elementwise op. Unary maps read A only; binary ones A and B. "
        "Comparisons take A and B of one dtype and give u8 1 or 0 (a NaN compares false: "
        "unequal, neither less nor greater); logic reads u8 operands (nonzero is true) into u8 1 or 0.",
        # (Name, "name", minor, comment, arity, family, builder). Families:
        # "arith" takes any dtype, "float" floats only (f32, f16, bf16),
        # "comparison" and "logic" as the doc says; each is one generated
        # predicate (is_float_only, ...). builder: the ops:: function (and
        # Python's tpuhal.ops function) that makes the map alone, generated
        # with its declaration, definition, binding, stub and test sample
        # (MAP_FAMILIES below); None where a hand-written builder makes it.
        values=[
            ("Identity", "identity", 1, "Y = A: copy, cast (A and Y dtypes differ), transpose (A strided)", 1, "arith", None),
            ("Add", "add", 1, "", 2, "arith", "add"),
            ("Sub", "sub", 1, "", 2, "arith", "sub"),
            ("Mul", "mul", 1, "", 2, "arith", "mul"),
            ("Div", "div", 1, "", 2, "arith", "div"),
            ("Max", "max", 1, "NaN where either is NaN", 2, "arith", "max"),
            ("Min", "min", 1, "NaN where either is NaN", 2, "arith", "min"),
            ("Activation", "activation", 1, "Y = activation(A), the attributes' activation", 1, "float", None),
            ("Abs", "abs", 1, "", 1, "arith", "abs"),
            ("Neg", "neg", 1, "", 1, "arith", "neg"),
            ("Exp", "exp", 1, "", 1, "float", "exp"),
            ("Log", "log", 1, "", 1, "float", "log"),
            ("Sqrt", "sqrt", 1, "", 1, "float", "sqrt"),
            ("Erf", "erf", 3, "the Gauss error function (ONNX Erf), computed in f32 and rounded to the output's dtype", 1, "float", "erf"),
            ("Equal", "equal", 7, "", 2, "comparison", "equal"),
            ("Less", "less", 7, "", 2, "comparison", "less"),
            ("LessOrEqual", "less_or_equal", 7, "", 2, "comparison", "less_equal"),
            ("Greater", "greater", 7, "", 2, "comparison", "greater"),
            ("GreaterOrEqual", "greater_or_equal", 7, "", 2, "comparison", "greater_equal"),
            ("And", "and", 7, "", 2, "logic", "logical_and"),
            ("Or", "or", 7, "", 2, "logic", "logical_or"),
            ("Xor", "xor", 7, "", 2, "logic", "logical_xor"),
            ("Not", "not", 7, "", 1, "logic", "logical_not"),
            ("Ceil", "ceil", 10, "exact", 1, "float", "ceil"),
            ("Floor", "floor", 10, "exact", 1, "float", "floor"),
            ("Round", "round", 10, "to the nearest integer, halves to even (ONNX Round); exact", 1, "float", "round"),
            ("Mod", "mod", 14, "a - floor(a / b) * b, the divisor's sign (ONNX Mod, numpy.mod); a mod 0 is 0 for "
             "integers, NaN for floats", 2, "arith", "mod"),
            ("Fmod", "fmod", 14, "a - trunc(a / b) * b, the dividend's sign (ONNX Mod with fmod 1, C's fmod); "
             "exact; a fmod 0 is 0 for integers, NaN for floats", 2, "arith", "fmod"),
            ("Sin", "sin", 17, "the sine, of radians, computed in f32 and rounded to the output's dtype", 1, "float", "sin"),
            ("Cos", "cos", 17, "the cosine, of radians, computed in f32 and rounded to the output's dtype", 1, "float", "cos"),
            ("Tan", "tan", 17, "the tangent, of radians, computed in f32 and rounded to the output's dtype", 1, "float", "tan"),
            ("Asin", "asin", 17, "the arcsine, in radians; NaN outside [-1, 1], computed in f32 and rounded to the output's dtype", 1, "float", "asin"),
            ("Acos", "acos", 17, "the arccosine, in radians; NaN outside [-1, 1], computed in f32 and rounded to the output's dtype", 1, "float", "acos"),
            ("Atan", "atan", 17, "the arctangent, in radians, computed in f32 and rounded to the output's dtype", 1, "float", "atan"),
            ("Sinh", "sinh", 17, "the hyperbolic sine, computed in f32 and rounded to the output's dtype", 1, "float", "sinh"),
            ("Cosh", "cosh", 17, "the hyperbolic cosine, computed in f32 and rounded to the output's dtype", 1, "float", "cosh"),
            ("Asinh", "asinh", 17, "the inverse hyperbolic sine, computed in f32 and rounded to the output's dtype", 1, "float", "asinh"),
            ("Acosh", "acosh", 17, "the inverse hyperbolic cosine; NaN below 1, computed in f32 and rounded to the output's dtype", 1, "float", "acosh"),
            ("Atanh", "atanh", 17, "the inverse hyperbolic tangent; NaN outside [-1, 1], infinite at -1 and 1, computed in f32 and rounded to the output's dtype", 1, "float", "atanh"),
        ],
    ),
    dict(
        name="ResizeMode",
        layers=("fw", "hal"),
        doc="How Resize samples: ONNX's mode attribute.",
        values=[("Nearest", "nearest", 1, ""), ("Linear", "linear", 1, "bilinear over H and W")],
    ),
    dict(
        name="CoordinateMode",
        layers=("fw", "hal"),
        doc="How Resize maps an output coordinate to the input: ONNX's coordinate_transformation_mode.",
        values=[
            ("HalfPixel", "half_pixel", 1, ""),
            ("Asymmetric", "asymmetric", 1, ""),
            ("AlignCorners", "align_corners", 1, ""),
            ("PytorchHalfPixel", "pytorch_half_pixel", 1, ""),
            ("TfHalfPixelForNn", "tf_half_pixel_for_nn", 1, ""),
        ],
    ),
    dict(
        name="NearestMode",
        layers=("fw", "hal"),
        doc="How nearest Resize rounds: ONNX's nearest_mode.",
        values=[
            ("RoundPreferFloor", "round_prefer_floor", 1, ""),
            ("RoundPreferCeil", "round_prefer_ceil", 1, ""),
            ("Floor", "floor", 1, ""),
            ("Ceil", "ceil", 1, ""),
        ],
    ),
    dict(
        name="ScatterReduction",
        layers=("fw", "hal"),
        doc="How ScatterElements combines an update with the element it lands on: ONNX's reduction.",
        values=[
            ("None", "none", 16, "the update replaces it"),
            ("Add", "add", 16, ""),
            ("Mul", "mul", 16, ""),
            ("Max", "max", 16, "NaN where either is NaN"),
            ("Min", "min", 16, "NaN where either is NaN"),
        ],
    ),
    dict(
        name="RoiAlignMode",
        layers=("fw", "hal"),
        doc="How RoiAlign pools a bin's samples: ONNX's mode.",
        values=[
            ("Average", "avg", 22, "the mean of the samples"),
            ("Max", "max", 22, "the largest of the samples, each the largest of its four weighted corners (ONNX's "
             "max mode, as ONNX Runtime computes it)"),
        ],
    ),
    dict(
        name="ColorFormat",
        layers=("fw", "hal"),
        doc="The YUV layout ColorConvert reads.",
        values=[("NV12", "nv12", 1, "luma, then interleaved UV"), ("I420", "i420", 1, "luma, U, V")],
    ),
]

# ---- op kinds ---------------------------------------------------------------
#
# One entry per kind, in wire-code order (codes start at 1).
#   name      the enumerator: fw::OpKind::k<name>, driver::OpKind::<name>
#   id        to_string of both kinds: messages, traces, the tools
#   minor     the interface minor the kind came in
#   tensors   roles in order, output last; "?" marks an optional tensor
#   fw_attrs  the firmware's attribute struct (fw/tensor.h, or ATTR_STRUCTS); QuantAttrs is
#             16 reserved bytes, for kinds with nothing to say
#   attrs     the HAL's alternative of driver::OpAttrs (driver/op_desc.hpp)
#   cost      how its operations are counted (hal/src/op_cost.cpp), one of
#               ("matmul", A)           2 * outputs * A's inner dimension
#               ("conv", W)             2 * outputs * W's Cin/groups * kh * kw
#               ("conv_transpose", X, W) 2 * X's elements * W's [1] * kh * kw
#               ("pool",)               outputs * kernel taps
#               ("per_output",)         one per output element
#               ("scan", T)             one per element of T or of the output,
#                                       whichever has more
#   cycles    vector-unit cycles per output element (pool: per window tap)
#             in the board's timing model (fw/timing.h, docs/timing.md):
#             an int, or "elementwise" (by the op's ElementwiseOp and
#             activation, VECTOR_CYCLES below); matmul and convolution
#             kinds give 0 and pay for a fused activation by its cycles
#   peak      the board's peak it is measured against: "float" (fp32 or
#             fp16 by the first input's dtype), "int8", or None (memory
#             decides its speed)
#   builders  the ops:: functions that make it (ops.hpp, Python's tpuhal.ops)
#   doc       what it computes, in one line
#   rule      (optional) the kind's rules, from which the generator writes
#             the board's decoder check, the ops:: builder with its host
#             checks, its Python function and stub, its row in docs/ops.md
#             and the decoder's rule test (tests/fw/op_rules_test.cpp):
#               dtypes  per tensor role, the dtypes it takes ["f32", ...]
#                       (ANY: every dtype), or another role's name: that
#                       tensor's dtype
#               shapes  per tensor role, another role's name: that
#                       tensor's shape (the output needs one)
#               axes    per u32 attribute field, the role whose axis it is
#                       (< its rank; the builder takes -rank..rank-1)
#               dims    per tensor role without a shapes link, its shape
#                       as a pattern: each dimension a number, or a name
#                       that every dimension of that name shares (the
#                       first one met, in role order, sets it)
#               ranges  per f32 attribute field, (low, high), inclusive;
#                       None for no bound (the value is finite either way);
#                       per u32 field that is a count, not an axis, its
#                       (low, high), integers, inclusive
#               broadcast  per input role, the role it broadcasts to as in
#                       NumPy (the builder's view; the board sees the
#                       target's shape with stride 0 where broadcast)
#               splice  per tensor role, (into, axis field, part): into's
#                       shape with that axis replaced by part's whole
#                       shape (Gather), at most kMaxRank dimensions
#               scalars  per input role, the tensor whose shape its one
#                       value spans: any shape of one element to the
#                       builder; on the wire that tensor's shape with
#                       stride 0 along every dimension; samples give [1]
#               defaults  per attribute field, the builder's default
#                       where it is not the wire's (an axis may count
#                       from the end: -1, the last)
#               variant  (bool field, name): the op's name where that
#                       field is set (errors, traces, profiles), and the
#                       model file's op of that name, which sets it (the
#                       kind's own name clears it; neither op takes the
#                       field as an attribute: a reader that predates the
#                       variant refuses it rather than run the kind)
#               per_axis  per input role, the tensor it runs along: a
#                       scalar (any shape of one element) or 1-D along the
#                       builder's argument `axis` (default 1, negative from
#                       the end; not on the wire: the board sees the
#                       target's shape, stride 0 where it repeats); one
#                       target for all such roles; samples give [1]
#               matmul  (A, B, Y): Y = A @ B over the last two dimensions,
#                       A [..., M, K], B [..., K, N], Y [..., M, N], rank 2
#                       or more, batch dimensions broadcast as NumPy's
#                       matmul (the builder's views: the board sees A and
#                       B with Y's batch dimensions, stride 0 where they
#                       repeat)
#               per_row  per input role, the matmul operand (A or B role)
#                       it runs along: a scalar (any shape of one element)
#                       or one value per row of it, 1-D; on the wire the
#                       operand's shape, stride 0 along its last
#                       dimension; samples give [1]
#               per_column  the same, one value per column: stride 0
#                       along the operand's next-to-last dimension
#               within  per tensor role, (like, axis field): like's rank,
#                       and at most like's length in every dimension but
#                       the one the axis field names (ScatterElements'
#                       indices)
#               trailing  optional inputs the builder takes after the
#                       output, in this order, each defaulting to none
#                       (keyword-only in Python)
#               k_along  per tensor role, (of, axis field): of's shape
#                       with k, 1 to of's length, along the axis the field
#                       names (TopK's indices); of's length there at most
#                       2^31 - 1, as i32 indices reach
#               outputs  optional roles besides the last that the op also
#                       writes: none may write an element twice or overlap
#                       another tensor (TopK's values)
#               options  the name of a struct of the attributes, with the
#                       builder's defaults, that the builder takes in their
#                       place (ops::TopKOptions); Python keeps keywords
#               shortcuts  per further builder of the kind (ops::argmax),
#                       dict(set={field: value}, absent=[optional roles],
#                       k=the k_along length it fixes, doc=one line): the
#                       kind with those fields set and roles absent, its
#                       other attributes as parameters after the tensors;
#                       errors, traces and profiles use its name
#             Every tensor needs its dtype; every u32 field must be an
#             axis or a count with a range, every f32 field have a range;
#             bool fields are 0 or 1, enumeration fields one of its codes.
#             A kind without attributes has fw_attrs QuantAttrs and attrs
#             NoAttrs. An optional input ("Name?") is checked by its rules
#             where it is given and may only follow other tensors (its
#             dtype, shape, broadcast or axis); nothing may follow it.
#             An output other than the last is an optional role that
#             outputs names (docs/adding-an-op.md).
#   sample    (with rule) a small valid op: dtypes and shapes per role,
#             attribute values (others take their default). Tests, the
#             fuzzer's seed and the docs use it; inputs hold 1s.
# The elementwise maps that have a builder of their own (ElementwiseOp's
# builder above), by (family, arity): the operands, what the map computes
# and the dtypes it takes. Each map gets, generated from this and its value:
# its declaration in tpuhal/ops.hpp, its definition (hal/src/ops.cpp), its
# Python function and stub, its row in docs/ops.md and its sample in the
# ops tests (tests/ops/op_maps_test.cpp checks each against its family).
MAP_FAMILIES = {
    ("arith", 2): dict(operands="a, b, y", computes="elementwise, a and b broadcast to y's shape as in NumPy; "
                       "integers wrap, integer division rounds toward zero and division by zero gives 0", dtypes="a, b and y one dtype, any"),
    ("arith", 1): dict(operands="x, y", computes="elementwise, x broadcast to y's shape as in NumPy; integers wrap",
                       dtypes="x and y one dtype, any"),
    ("float", 1): dict(operands="x, y", computes="elementwise, x broadcast to y's shape as in NumPy",
                       dtypes="x and y one dtype, a float (f32, f16, bf16)"),
    ("comparison", 2): dict(operands="a, b, y", computes="1 where the comparison holds, else 0, a and b broadcast "
                            "to y's shape as in NumPy; a NaN compares false (equal to nothing, neither less nor "
                            "greater); f16 and bf16 compare as f32", dtypes="a and b one dtype, any; y u8"),
    ("logic", 2): dict(operands="a, b, y", computes="logic on ONNX's bool as u8 (nonzero is true) into 1 or 0, "
                       "a and b broadcast to y's shape as in NumPy", dtypes="u8"),
    ("logic", 1): dict(operands="x, y", computes="logic on ONNX's bool as u8 (nonzero is true) into 1 or 0, "
                       "x broadcast to y's shape as in NumPy", dtypes="u8"),
}

# Attribute structs written from the schema, for every kind but those
# without attributes (QuantAttrs, 16 reserved bytes, in fw/tensor.h;
# NoAttrs in driver/op_desc.hpp). One entry per struct, named as a kind's
# fw_attrs and attrs name it; fields in wire order, each (name, type,
# default, comment), or with a fifth item, a dict of the views where they
# differ from the defaults:
#   hal       the HAL's name of the field ("strides" for the wire's "stride")
#   hal_bool  (an enumeration of two values) the HAL holds a bool named
#             `hal`, true for this value ("max": PoolAttrs::max)
#   params    (an activation) the wire names of its two parameter words,
#             act_alpha and act_beta unless given
# Types:
#   "u32"     a count or an index; std::uint32_t in both layers
#   "bool"    a uint32 0 or 1 on the wire, bool in the HAL
#   "f32"     an IEEE binary32 word, float in both layers; its default a
#             decimal number
#   "u32[N]", "f32[N]"  N such words; std::array in the HAL, every element
#             the default
#   "activation"  three words, the Activation's code then its two f32
#             parameters (`act_alpha`, `act_beta` on the wire);
#             ActivationParams in the HAL; default "none"
#   "reserved"  one reserved word (zero) in place, not in the HAL
#   or the name of an enumeration of ENUMS declared in both layers (its
#   code a uint32 on the wire, the HAL's enum in the HAL; its default a
#   value's "name").
# Rules (KINDS' rule) read structs of scalar fields only (u32, bool, f32,
# an enumeration) without a HAL view. On the wire the fields are followed
# by reserved words (zero) up to a multiple of 16 bytes, or up to `words`
# words where the struct gives it. Never reorder fields of a struct a
# board already takes; a new field goes at the end, in a reserved word,
# with the interface minor that reads it.
ATTR_STRUCTS = [
    dict(name="ElementwiseAttrs", doc="An elementwise map: `op`, and for ElementwiseOp activation the activation "
         "with its parameters (none for every other op).",
         fields=[("op", "ElementwiseOp", "identity", ""),
                 ("activation", "activation", "none", "for op activation", {"params": ("alpha", "beta")})]),
    dict(name="MatMulAttrs", doc="Y = act(alpha * op(A) @ op(B) + beta * C), batched; op(A) is A with its last two "
         "dimensions transposed where trans_a is set (B likewise).",
         fields=[("trans_a", "bool", "false", "use A's last two dimensions transposed", {"hal": "transpose_a"}),
                 ("trans_b", "bool", "false", "use B's last two dimensions transposed", {"hal": "transpose_b"}),
                 ("alpha", "f32", "1", ""), ("beta", "f32", "1", "scales C; C absent: ignored"),
                 ("activation", "activation", "none", "fused after")]),
    dict(name="ConvAttrs", doc="Convolution geometry: pads are top, left, bottom, right. A transposed convolution "
         "(kConvTranspose2d) takes W as [Cin, Cout/groups, kh, kw] and pads crop its output.",
         fields=[("layout", "Layout", "nchw", "X's and Y's; W is always [Cout, Cin/groups, kh, kw]"),
                 ("groups", "u32", "1", ""),
                 ("stride", "u32[2]", "1", "along H, W", {"hal": "strides"}),
                 ("dilation", "u32[2]", "1", "along H, W", {"hal": "dilations"}),
                 ("pad", "u32[4]", "0", "top, left, bottom, right", {"hal": "pads"}),
                 ("activation", "activation", "none", "float convolution only"),
                 ("accumulate", "bool", "false", "kConv2d only: Y = act(conv + bias + Y as it was)", {"minor": 23})]),
    dict(name="PoolAttrs", doc="Max or average pooling over a window of H and W; pads are top, left, bottom, right.",
         fields=[("kind", "PoolKind", "max", "", {"hal": "max", "hal_bool": "max"}),
                 ("layout", "Layout", "nchw", ""),
                 ("kernel", "u32[2]", "1", "along H, W"),
                 ("stride", "u32[2]", "1", "along H, W", {"hal": "strides"}),
                 ("dilation", "u32[2]", "1", "along H, W", {"hal": "dilations"}),
                 ("pad", "u32[4]", "0", "top, left, bottom, right", {"hal": "pads"}),
                 ("ceil_mode", "bool", "false", "output size rounds up"),
                 ("count_include_pad", "bool", "false", "average: divide by the full window")]),
    dict(name="ResizeAttrs", doc="Resize over H and W by ONNX's mode, coordinate_transformation_mode and "
         "nearest_mode.",
         fields=[("mode", "ResizeMode", "nearest", ""), ("coordinate", "CoordinateMode", "half_pixel", ""),
                 ("nearest", "NearestMode", "round_prefer_floor", ""), ("layout", "Layout", "nchw", ""),
                 ("scale", "f32[2]", "1", "output/input along H and W (> 0)", {"hal": "scales"})]),
    dict(name="ColorConvertAttrs", doc="YUV (BT.601, limited range) -> RGB in [0, 255], then per channel (value - "
         "mean) * scale. Luma is [H, W]; NV12 chroma is [H/2, W/2, 2]; I420 chroma U and V are [H/2, W/2] each; Y "
         "is [3, H, W] (planar RGB).", words=14,
         fields=[("format", "ColorFormat", "nv12", ""), ("reserved0", "reserved", "0", ""),
                 ("mean", "f32[3]", "0", "subtracted from R, G, B"), ("scale", "f32[3]", "0", "then multiplied")]),
    dict(name="SoftmaxAttrs", doc="Y = exp(X - max) / sum(exp(X - max)) along `axis`; with log, its log, "
         "X - max - log(sum(exp(X - max))), finite where a log of the softmax would underflow.",
         fields=[("axis", "u32", "0", "< rank"), ("log", "bool", "false", "log-softmax")]),
    dict(name="TopKAttrs",
         doc="TopK: Indices (I32) has X's shape but k (1 <= k <= X's length) along `axis`; Values, when "
         "present, Indices' shape and X's dtype. Order: largest first (smallest with largest == 0), NaN "
         "before every number either way, ties by index, lower first (higher first with last_index == 1).",
         fields=[("axis", "u32", "0", "< rank"), ("largest", "bool", "true", "false: the smallest"),
                 ("last_index", "bool", "false", "ties: the higher index first (ONNX select_last_index)")]),
    dict(name="CumSumAttrs",
         doc="Y[i] along `axis` = X[0] + ... + X[i] (X[0] + ... + X[i - 1] with exclusive, 0 first; from the "
         "last index down with reverse). Floats add in f32, in index order along the axis, and each sum is "
         "rounded to Y's dtype; i32 wraps.",
         fields=[("axis", "u32", "0", "< X's rank"), ("exclusive", "bool", "false", "leave X[i] itself out"),
                 ("reverse", "bool", "false", "sum from the last index down")]),
    dict(name="GatherAttrs",
         doc="Y = X indexed along `axis` by Indices (ONNX Gather, NumPy's take; i32, u8 or i8, any rank: bytes are "
         "a table lookup, an i8 index is signed, -1 the last entry, since interface 1.12; -dim <= index < dim, a negative one "
         "counting from the end): Y's shape is X's with the axis replaced by Indices' shape (rank X.rank - 1 "
         "+ Indices.rank <= kMaxRank; a scalar index drops the axis), Y of X's dtype. An index outside that range fails the op with "
         "kBadArgument (the Indices tensor's field, the index, the axis's length), and Y is not written.",
         fields=[("axis", "u32", "0", "< X's rank")]),
    dict(name="NmsAttrs",
         doc="Non-maximum suppression of scored boxes, each batch on its own. A box's score is its best class's "
         "(the lowest class index among equals; NaN scores never win); a box is a candidate when its score is above "
         "score_threshold. Candidates are taken by score, highest first, ties by box index, lower first; one is kept "
         "unless a kept box (of its class, or of any class with class_agnostic) overlaps it by an IoU above "
         "iou_threshold, until Y's M rows are full. IoU is intersection / (area + area - intersection) in f32 on the "
         "corners (x1, y1, x2, y2), as torchvision's nms computes it, and both thresholds are compared as f32. Y's rows: x1, y1, x2, y2, score, class, best "
         "first; the rows after the last kept box are 0, 0, 0, 0, 0, -1. The class index is exact below 2^24 in f32, "
         "2049 in f16, 257 in bf16.",
         fields=[("iou_threshold", "f32", "0.45", "boxes overlapping a kept one by more are dropped"),
                 ("score_threshold", "f32", "0.25", "candidates score above it"),
                 ("center", "bool", "true", "Boxes are (cx, cy, w, h); else (x1, y1, x2, y2)"),
                 ("class_agnostic", "bool", "false", "a kept box suppresses boxes of every class")]),
    dict(name="RoiAlignAttrs",
         doc="Y[r, c] = X[BatchIndices[r], c] pooled over region r of Rois (x1, y1, x2, y2, in X's pixels once "
         "multiplied by spatial_scale) cut into Y's OH x OW bins (ONNX RoiAlign, NCHW). Each bin is the mean (or max) "
         "of a grid of samples, sampling_ratio along each axis (0: the bin's extent rounded up), each sample "
         "bilinear between its four nearest pixels; a sample more than one pixel outside X is 0, and a degenerate "
         "region gives 0. Every step is one f32 operation in ONNX Runtime's order, rounded to Y's dtype at the end. "
         "An empty X gives 0. A batch index counts from the end where negative, as gather's; one outside [-N, N) "
         "fails the op with kBadArgument (BatchIndices' data field, the index, N); so does a region with a "
         "coordinate not finite once scaled, or of more than 2^20 samples over its bins (Rois' row field, the "
         "region, 0 or 2^20). Y is then not written.",
         fields=[("mode", "RoiAlignMode", "avg", "how a bin pools its samples"),
                 ("sampling_ratio", "u32", "0", "samples per bin along each axis; 0: ceil(region extent / bins)"),
                 ("spatial_scale", "f32", "1", "multiplies the region's coordinates"),
                 ("half_pixel", "bool", "true", "the region shifted by half a pixel, -0.5 (ONNX's half_pixel, "
                  "torchvision's aligned); false: not shifted, each region at least 1 pixel wide and high "
                  "(output_half_pixel, opset 10's)")]),
    dict(name="ScatterElementsAttrs",
         doc="Y = X, then for each element of Indices in row-major order, the element of Y at its position with the "
         "coordinate along `axis` replaced by the index (-dim <= index < dim, a negative one counting from the end) "
         "becomes the matching element of Updates, or that combined with it by `reduction` (ONNX ScatterElements). "
         "Floats combine in f32 and round to Y's dtype at each step; integers wrap; where indices repeat, the later "
         "update comes later (the last one wins without a reduction). An index outside that range fails the op with "
         "kBadArgument (the Indices tensor's field, the index, the axis's length), and Y is not written.",
         fields=[("axis", "u32", "0", "< X's rank"),
                 ("reduction", "ScatterReduction", "none", "how an update combines with the element")]),
]

# Vector-unit cycles per element beyond the one every element takes, for
# the kinds whose cycles are "elementwise": by ElementwiseOp value and by
# Activation value (a fused activation of matmul and convolution costs its
# Activation's entry). Values not listed take 1 (an activation "none": 0).
# The transcendental ones are series of multiply-adds on the vector unit:
# on the BM1684X, SiLU costs about 8 cycles per element and lane at 16
# elements per lane and cycle, fitted with YOLOv5s, YOLOv8s and YOLOX-s
# together (docs/timing.md: 3.2 ms of YOLOv5s in fp32).
VECTOR_CYCLES = {
    "ElementwiseOp": {"Div": 40, "Mod": 42, "Fmod": 42, "Exp": 150, "Log": 150, "Sqrt": 40, "Erf": 200,
                      "Activation": "activation", **{op: 150 for op in ("Sin", "Cos", "Tan", "Asin", "Acos", "Atan",
                                                                        "Sinh", "Cosh", "Asinh", "Acosh", "Atanh")}},
    "Activation": {"None": 0, "Sigmoid": 150, "Silu": 128, "Tanh": 150, "HardSigmoid": 2, "HardSwish": 3},
}

# Tensor roles that hold a layer's weights: in the timing model they stream
# from device memory, where activations small enough stay in local memory.
WEIGHT_ROLES = ("W", "Bias", "WScale", "WZeroPoint")

# Every dtype a tensor can have: a rule's "dtypes" entry for a role that
# takes any.
ANY = ["f32", "f16", "bf16", "i8", "u8", "i32"]

# The builders of the maps (ElementwiseOp's builder column), in code order.
MAP_BUILDERS = [v[6] for e in ENUMS if e["name"] == "ElementwiseOp" for v in e["values"] if v[6]]

# qlinear_add's and qlinear_mul's tensors, rules and sample: two u8 or i8
# operands, each with one scale and zero point, broadcast to Y.
QLINEAR_BINARY = dict(
    tensors=["A", "AScale", "AZeroPoint", "B", "BScale", "BZeroPoint", "YScale", "YZeroPoint", "Y"],
    rule=dict(dtypes={"A": ["u8", "i8"], "AScale": ["f32"], "AZeroPoint": "A", "B": ["u8", "i8"], "BScale": ["f32"],
                      "BZeroPoint": "B", "YScale": ["f32"], "YZeroPoint": "Y", "Y": ["u8", "i8"]},
              broadcast={"A": "Y", "B": "Y"},
              scalars={"AScale": "Y", "AZeroPoint": "Y", "BScale": "Y", "BZeroPoint": "Y", "YScale": "Y",
                       "YZeroPoint": "Y"}),
    sample=dict(dtypes={"A": "u8", "AScale": "f32", "AZeroPoint": "u8", "B": "i8", "BScale": "f32", "BZeroPoint": "i8",
                        "YScale": "f32", "YZeroPoint": "u8", "Y": "u8"},
                shapes={"A": [2, 3], "AScale": [1], "AZeroPoint": [1], "B": [2, 3], "BScale": [1], "BZeroPoint": [1],
                        "YScale": [1], "YZeroPoint": [1], "Y": [2, 3]}))

# Where the shape rule of a kind without a `rule` lives: functions of a
# header both layers may include, or the helpers of a rule part (the host
# makes the views, the board checks them).
SHAPE_RULES = {
    "window": "`fw/window.h` (`conv_shape`, `conv_transpose_shape`, `pool_shape`), read by both layers",
    "matmul": "the rule part matmul's helpers, with transposes: the host's `matmul_views` broadcasts the batch "
              "dimensions, the board's `check_matmul_shapes` checks the views",
    "broadcast": "the rule part broadcast's helpers: the host's `Builder::broadcast` makes views in Y's shape, "
                 "the board's `expect_same_shape` checks them",
    "planes": "`fw/planes.h` (`luma_even`, `color_planes`; resize's `resize_scale_ok`, with Y keeping X's "
              "batch and channels one comparison in each layer), read by both layers",
}

KINDS = [
    dict(name="MatMul", id="matmul", shape="matmul", minor=1, tensors=["A", "B", "C?", "Y"], fw_attrs="MatMulAttrs",
         attrs="MatMulAttrs", cost=("matmul", "A"), cycles=0, peak="float", builders=["matmul"],
         doc="Y = act(alpha * op(A) @ op(B) + beta * C), batched."),
    dict(name="Conv2d", id="conv2d", shape="window", minor=1, tensors=["X", "W", "Bias?", "Y"], fw_attrs="ConvAttrs",
         attrs="ConvAttrs", cost=("conv", "W"), cycles=0, peak="float", builders=["conv2d"],
         doc="Float convolution, NCHW or NHWC, groups, dilation; Y read too where it accumulates."),
    dict(name="Pool2d", id="pool2d", shape="window", minor=1, tensors=["X", "Y"], fw_attrs="PoolAttrs", attrs="PoolAttrs",
         cost=("pool",), cycles=1, peak=None, builders=["max_pool2d", "avg_pool2d"], doc="Max or average pooling."),
    dict(name="Elementwise", id="elementwise", shape="broadcast", minor=1, tensors=["A", "B?", "Y"], fw_attrs="ElementwiseAttrs",
         attrs="ElementwiseAttrs", cost=("per_output",), cycles="elementwise", peak=None,
         builders=["activation", "relu", "cast", "transpose"] + MAP_BUILDERS,
         doc="Unary and binary maps, including cast and transpose (B absent for unary maps)."),
    dict(name="Softmax", id="softmax", minor=1, tensors=["X", "Y"], fw_attrs="SoftmaxAttrs", attrs="SoftmaxAttrs",
         cost=("per_output",), cycles=160, peak=None, builders=["softmax"], doc="Softmax or log-softmax along one axis.",
         rule=dict(dtypes={"X": ["f32", "f16", "bf16"], "Y": "X"}, shapes={"Y": "X"}, axes={"axis": "X"},
                   defaults={"axis": -1}, variant=("log", "log_softmax")),
         sample=dict(dtypes={"X": "f32", "Y": "f32"}, shapes={"X": [2, 3], "Y": [2, 3]}, attrs={"axis": 1})),
    dict(name="Quantize", id="quantize", minor=1, tensors=["X", "Scale", "ZeroPoint?", "Y"], fw_attrs="QuantAttrs",
         attrs="NoAttrs", cost=("per_output",), cycles=2, peak=None, builders=["quantize"],
         doc="y = saturate(round_half_even(x / scale) + zero_point), in f32 (ONNX QuantizeLinear; no zero point: 0)",
         rule=dict(dtypes={"X": ["f32", "f16", "bf16", "i32"], "Scale": ["f32"], "ZeroPoint": "Y", "Y": ["u8", "i8"]},
                   shapes={"Y": "X"}, per_axis={"Scale": "X", "ZeroPoint": "X"}),
         sample=dict(dtypes={"X": "f32", "Scale": "f32", "ZeroPoint": "u8", "Y": "u8"},
                     shapes={"X": [2, 3], "Scale": [1], "ZeroPoint": [1], "Y": [2, 3]})),
    dict(name="Dequantize", id="dequantize", minor=1, tensors=["X", "Scale", "ZeroPoint?", "Y"],
         fw_attrs="QuantAttrs", attrs="NoAttrs", cost=("per_output",), cycles=2, peak=None, builders=["dequantize"],
         doc="y = (x - zero_point) * scale, in f32 (ONNX DequantizeLinear; no zero point: 0)",
         rule=dict(dtypes={"X": ["u8", "i8", "i32"], "Scale": ["f32"], "ZeroPoint": "X", "Y": ["f32", "f16", "bf16"]},
                   shapes={"Y": "X"}, per_axis={"Scale": "X", "ZeroPoint": "X"}),
         sample=dict(dtypes={"X": "u8", "Scale": "f32", "ZeroPoint": "u8", "Y": "f32"},
                     shapes={"X": [2, 3], "Scale": [1], "ZeroPoint": [1], "Y": [2, 3]})),
    dict(name="MatMulInteger", id="matmul_integer", minor=1, tensors=["A", "B", "AZeroPoint?", "BZeroPoint?", "Y"],
         fw_attrs="QuantAttrs", attrs="NoAttrs", cost=("matmul", "A"), cycles=0, peak="int8", builders=["matmul_integer"],
         doc="Y = (A - AZeroPoint) @ (B - BZeroPoint), summed exactly in int32, wrapping (ONNX MatMulInteger; no "
         "zero point: 0)",
         rule=dict(dtypes={"A": ["u8", "i8"], "B": ["u8", "i8"], "AZeroPoint": "A", "BZeroPoint": "B", "Y": ["i32"]},
                   matmul=("A", "B", "Y"), per_row={"AZeroPoint": "A"}, per_column={"BZeroPoint": "B"},
                   trailing=["AZeroPoint", "BZeroPoint"]),
         sample=dict(dtypes={"A": "u8", "B": "i8", "AZeroPoint": "u8", "BZeroPoint": "i8", "Y": "i32"},
                     shapes={"A": [2, 3], "B": [3, 4], "AZeroPoint": [1], "BZeroPoint": [1], "Y": [2, 4]})),
    dict(name="ConvInteger", id="conv_integer", shape="window", minor=1, tensors=["X", "W", "XZeroPoint?", "WZeroPoint?", "Y"],
         fw_attrs="ConvAttrs", attrs="ConvAttrs", cost=("conv", "W"), cycles=0, peak="int8", builders=["conv_integer"],
         doc="Integer convolution with zero points, int32 accumulation."),
    dict(name="QLinearMatMul", id="qlinear_matmul", minor=1,
         tensors=["A", "AScale", "AZeroPoint", "B", "BScale", "BZeroPoint", "YScale", "YZeroPoint", "Y"],
         fw_attrs="QuantAttrs", attrs="NoAttrs", cost=("matmul", "A"), cycles=0, peak="int8", builders=["qlinear_matmul"],
         doc="Y = saturate(round_half_even(float(acc) * m) + YZeroPoint), where acc = (A - AZeroPoint) @ "
         "(B - BZeroPoint) is summed exactly in int32 (wrapping) and m = AScale * BScale / YScale is formed in f32, "
         "the product rounded to f32 once (ONNX QLinearMatMul)",
         rule=dict(dtypes={"A": ["u8", "i8"], "AScale": ["f32"], "AZeroPoint": "A", "B": ["u8", "i8"],
                           "BScale": ["f32"], "BZeroPoint": "B", "YScale": ["f32"], "YZeroPoint": "Y", "Y": ["u8", "i8"]},
                   matmul=("A", "B", "Y"), per_row={"AScale": "A", "AZeroPoint": "A"},
                   per_column={"BScale": "B", "BZeroPoint": "B"}, scalars={"YScale": "Y", "YZeroPoint": "Y"}),
         sample=dict(dtypes={"A": "u8", "AScale": "f32", "AZeroPoint": "u8", "B": "i8", "BScale": "f32",
                             "BZeroPoint": "i8", "YScale": "f32", "YZeroPoint": "u8", "Y": "u8"},
                     shapes={"A": [2, 3], "AScale": [1], "AZeroPoint": [1], "B": [3, 4], "BScale": [1],
                             "BZeroPoint": [1], "YScale": [1], "YZeroPoint": [1], "Y": [2, 4]})),
    dict(name="QLinearConv", id="qlinear_conv", shape="window", minor=1,
         tensors=["X", "XScale", "XZeroPoint", "W", "WScale", "WZeroPoint", "YScale", "YZeroPoint", "Bias?", "Y"],
         fw_attrs="ConvAttrs", attrs="ConvAttrs", cost=("conv", "W"), cycles=0, peak="int8", builders=["qlinear_conv"],
         doc="Quantized convolution, requantised to Y's scale."),
    dict(name="Resize", id="resize", shape="planes", minor=1, tensors=["X", "Y"], fw_attrs="ResizeAttrs", attrs="ResizeAttrs",
         cost=("per_output",), cycles=3, peak=None, builders=["resize"], doc="Nearest or bilinear over H and W."),
    dict(name="ColorConvert", id="color_convert", shape="planes", minor=1, tensors=["Luma", "ChromaU", "ChromaV?", "Y"],
         fw_attrs="ColorConvertAttrs", attrs="ColorConvertAttrs", cost=("per_output",), cycles=6, peak=None,
         builders=["nv12_to_rgb", "i420_to_rgb"],
         doc="NV12 / I420 -> planar RGB, normalised (ChromaU holds UV for NV12)."),
    dict(name="TopK", id="top_k", minor=5, tensors=["X", "Values?", "Indices"], fw_attrs="TopKAttrs",
         attrs="TopKAttrs", cost=("per_output",), cycles=4, peak=None, builders=["top_k", "argmax", "argmin"],
         doc="The k largest (or smallest) along one axis, sorted.",
         rule=dict(dtypes={"X": ANY, "Values": "X", "Indices": ["i32"]}, shapes={"Values": "Indices"},
                   axes={"axis": "X"}, defaults={"axis": -1}, k_along={"Indices": ("X", "axis")},
                   outputs=["Values"], options="TopKOptions",
                   shortcuts={"argmax": dict(set={"largest": "true"}, absent=["Values"], k=1,
                                             doc="the index of the largest element along axis"),
                              "argmin": dict(set={"largest": "false"}, absent=["Values"], k=1,
                                             doc="the index of the smallest element along axis")}),
         sample=dict(dtypes={"X": "f32", "Values": "f32", "Indices": "i32"},
                     shapes={"X": [2, 5], "Values": [2, 3], "Indices": [2, 3]}, attrs={"axis": 1})),
    dict(name="ConvTranspose2d", id="conv_transpose2d", shape="window", minor=5, tensors=["X", "W", "Bias?", "Y"],
         fw_attrs="ConvAttrs", attrs="ConvAttrs", cost=("conv_transpose", "X", "W"), cycles=0, peak="float",
         builders=["conv_transpose2d"], doc="Transposed convolution."),
    dict(name="Where", id="where", minor=5, tensors=["Cond", "A", "B", "Y"], fw_attrs="QuantAttrs", attrs="NoAttrs",
         cost=("per_output",), cycles=1, peak=None, builders=["where"],
         doc="Y = Cond ? A : B, elementwise (Cond nonzero is true).",
         rule=dict(dtypes={"Cond": ["u8"], "A": ANY, "B": "A", "Y": "A"}, broadcast={"Cond": "Y", "A": "Y", "B": "Y"}),
         sample=dict(dtypes={"Cond": "u8", "A": "f32", "B": "f32", "Y": "f32"},
                     shapes={"Cond": [2, 3], "A": [2, 3], "B": [2, 3], "Y": [2, 3]})),
    dict(name="Gather", id="gather", minor=11, tensors=["X", "Indices", "Y"], fw_attrs="GatherAttrs",
         attrs="GatherAttrs", cost=("per_output",), cycles=1, peak=None, builders=["gather"],
         doc="Y = X indexed along one axis by Indices (i32, u8 or i8; negative counts from the end).",
         rule=dict(dtypes={"X": ANY, "Indices": ["i32", "u8", "i8"], "Y": "X"}, axes={"axis": "X"},
                   splice={"Y": ("X", "axis", "Indices")}),
         sample=dict(dtypes={"X": "f32", "Indices": "i32", "Y": "f32"},
                     shapes={"X": [3, 4], "Indices": [2, 2], "Y": [3, 2, 2]}, attrs={"axis": 1})),
    dict(name="QLinearAdd", id="qlinear_add", minor=12,
         fw_attrs="QuantAttrs", attrs="NoAttrs", cost=("per_output",), cycles=4, peak=None, builders=["qlinear_add"],
         doc="Y = saturate(round_half_even(((A - AZeroPoint) * AScale + (B - BZeroPoint) * BScale) / YScale) + "
         "YZeroPoint), each step one f32 operation: the bits of dequantize, add and quantize in a row (ONNX's "
         "com.microsoft QLinearAdd).",
         **QLINEAR_BINARY),
    dict(name="CumSum", id="cumsum", minor=13, tensors=["X", "Y"], fw_attrs="CumSumAttrs", attrs="CumSumAttrs",
         cost=("per_output",), cycles=1, peak=None, builders=["cumsum"],
         doc="Running sums along one axis (ONNX CumSum).",
         rule=dict(dtypes={"X": ["f32", "f16", "bf16", "i32"], "Y": "X"}, shapes={"Y": "X"}, axes={"axis": "X"}),
         sample=dict(dtypes={"X": "f32", "Y": "f32"}, shapes={"X": [2, 3], "Y": [2, 3]}, attrs={"axis": 1})),
    dict(name="Nms", id="nms", minor=15, tensors=["Boxes", "Scores", "Y"], fw_attrs="NmsAttrs", attrs="NmsAttrs",
         cost=("scan", "Scores"), cycles=2, peak=None, builders=["nms"],
         doc="Non-maximum suppression: a detector's boxes and class scores to its detections.",
         rule=dict(dtypes={"Boxes": ["f32", "f16", "bf16"], "Scores": "Boxes", "Y": "Boxes"},
                   dims={"Boxes": ["B", "N", 4], "Scores": ["B", "N", "C"], "Y": ["B", "M", 6]},
                   ranges={"iou_threshold": (0, 1), "score_threshold": (None, None)}),
         sample=dict(dtypes={"Boxes": "f32", "Scores": "f32", "Y": "f32"},
                     shapes={"Boxes": [1, 4, 4], "Scores": [1, 4, 2], "Y": [1, 3, 6]},
                     attrs={"iou_threshold": 0.5, "score_threshold": 0.5})),
    dict(name="ScatterElements", id="scatter_elements", minor=16, tensors=["X", "Indices", "Updates", "Y"],
         fw_attrs="ScatterElementsAttrs", attrs="ScatterElementsAttrs", cost=("scan", "Updates"), cycles=1, peak=None,
         builders=["scatter_elements"],
         doc="Y = X with Updates written, or combined, at the positions Indices gives along one axis (ONNX "
         "ScatterElements).",
         rule=dict(dtypes={"X": ANY, "Indices": ["i32"], "Updates": "X", "Y": "X"},
                   shapes={"Y": "X", "Updates": "Indices"}, axes={"axis": "X"}, within={"Indices": ("X", "axis")}),
         sample=dict(dtypes={"X": "f32", "Indices": "i32", "Updates": "f32", "Y": "f32"},
                     shapes={"X": [3, 4], "Indices": [2, 3], "Updates": [2, 3], "Y": [3, 4]},
                     attrs={"axis": 0, "reduction": "add"})),
    dict(name="QLinearMul", id="qlinear_mul", minor=19,
         fw_attrs="QuantAttrs", attrs="NoAttrs", cost=("per_output",), cycles=4, peak=None, builders=["qlinear_mul"],
         doc="Y = saturate(round_half_even(((A - AZeroPoint) * AScale * ((B - BZeroPoint) * BScale)) / YScale) + "
         "YZeroPoint), each step one f32 operation: the bits of dequantize, mul and quantize in a row (ONNX's "
         "com.microsoft QLinearMul).",
         **QLINEAR_BINARY),
    dict(name="QLinearGlobalAvgPool", id="qlinear_global_avg_pool", minor=20,
         tensors=["X", "XScale", "XZeroPoint", "YScale", "YZeroPoint", "Y"], fw_attrs="QuantAttrs", attrs="NoAttrs",
         cost=("scan", "X"), cycles=2, peak=None, builders=["qlinear_global_avg_pool"],
         doc="Y[n, 0, 0, c] = saturate(round_half_even(m / YScale) + YZeroPoint), m the mean over h and w of "
         "(X[n, h, w, c] - XZeroPoint) * XScale, summed in f32 in (h, w) order and divided by H * W: the bits of "
         "dequantize, a global average pool and quantize in a row, NHWC (ONNX's com.microsoft "
         "QLinearGlobalAveragePool, channels last).",
         rule=dict(dtypes={"X": ["u8", "i8"], "XScale": ["f32"], "XZeroPoint": "X", "YScale": ["f32"],
                           "YZeroPoint": "Y", "Y": ["u8", "i8"]},
                   dims={"X": ["N", "H", "W", "C"], "Y": ["N", 1, 1, "C"]},
                   scalars={"XScale": "X", "XZeroPoint": "X", "YScale": "Y", "YZeroPoint": "Y"}),
         sample=dict(dtypes={"X": "u8", "XScale": "f32", "XZeroPoint": "u8", "YScale": "f32", "YZeroPoint": "i8",
                             "Y": "i8"},
                     shapes={"X": [2, 3, 4, 5], "XScale": [1], "XZeroPoint": [1], "YScale": [1], "YZeroPoint": [1],
                             "Y": [2, 1, 1, 5]})),
    dict(name="RoiAlign", id="roi_align", minor=22, tensors=["X", "Rois", "BatchIndices", "Y"],
         fw_attrs="RoiAlignAttrs", attrs="RoiAlignAttrs", cost=("per_output",), cycles=16, peak=None,
         builders=["roi_align"],
         doc="A detector's regions of interest pooled to a fixed size, bilinear (ONNX RoiAlign).",
         rule=dict(dtypes={"X": ["f32", "f16", "bf16"], "Rois": ["f32", "f16", "bf16"], "BatchIndices": ["i32"],
                           "Y": "X"},
                   dims={"X": ["N", "C", "H", "W"], "Rois": ["R", 4], "BatchIndices": ["R"],
                         "Y": ["R", "C", "OH", "OW"]},
                   ranges={"sampling_ratio": (0, 65536), "spatial_scale": (0, None)}),
         sample=dict(dtypes={"X": "f32", "Rois": "f32", "BatchIndices": "i32", "Y": "f32"},
                     shapes={"X": [2, 2, 5, 5], "Rois": [3, 4], "BatchIndices": [3], "Y": [3, 2, 2, 2]},
                     attrs={"sampling_ratio": 2, "spatial_scale": 0.5})),
]

# ---- builders of the kinds with shape rules of their own -------------------
#
# The kinds without a `rule` check their shapes by a named rule of SHAPE_RULES
# (KINDS' shape), in a hand-written builder body per kind (hal/src/ops.cpp)
# and decoder check (firmware_iface/src/tensor.cpp). Everything else about
# their builders is written here once, and the generator writes from it:
# the options structs and declarations (tpuhal/op_builders.inc), the Python
# functions and stubs, the model file's ops, the table of docs/ops.md and
# each kind's sample for op_kinds_test.
#
# OPTIONS: the builders' options structs, fields in declaration order, each
# (name, type, default, comment) or with a fifth item, a dict:
#   py        None: the Python keyword's default is None, which takes the
#             value of the field `none_is` names (a pool's strides: its
#             kernel); a u32[N] field only
#   none_is   that field, an earlier one
#   required  True: Python has no default (a pool's kernel); a u32[N] only
#   model     "optional": the model file may leave the attribute out (the
#             default), as files from before the field may; tensors,
#             activations and optional arrays may always be left out
# The model file reads every field of a builder's struct, its keywords or
# not, so that a builder refuses what it does not take (conv_transpose2d
# an `accumulate`) rather than run without it.
# Types: "bool", "u32", "f32", "u32[N]" and "f32[N]" (std::array; Python
# takes one int for every element of a u32[N]), "f32[N]?" (an optional
# array), "activation" (ActivationParams; Python: None, a tpuhal.Activation
# or a name), "tensor?" (an optional tensor, an operand of the op), or the
# name of an enumeration of ENUMS declared in the HAL (Python and the model
# file take its value's name).
OPTIONS = [
    dict(name="MatMulOptions",
         fields=[("transpose_a", "bool", "false", "use a's last two dimensions swapped"),
                 ("transpose_b", "bool", "false", ""),
                 ("alpha", "f32", "1", ""),
                 ("beta", "f32", "1", "scales c"),
                 ("c", "tensor?", None, "added: broadcast to y"),
                 ("activation", "activation", "none", "")]),
    dict(name="Conv2dOptions",
         fields=[("layout", "Layout", "nchw", "of x and y; w is [Cout, Cin/groups, kh, kw]", {"model": "optional"}),
                 ("strides", "u32[2]", "1", ""),
                 ("dilations", "u32[2]", "1", ""),
                 ("pads", "u32[4]", "0", "top, left, bottom, right"),
                 ("groups", "u32", "1", ""),
                 ("bias", "tensor?", None, "[Cout]; i32 for qlinear_conv"),
                 ("activation", "activation", "none", "float conv only"),
                 ("accumulate", "bool", "false", "conv2d only: y = activation(conv + bias + y as it was), each sum "
                  "rounded once in f32 (a residual connection's add, fused; the board needs interface 1.23)",
                  {"model": "optional"})]),
    dict(name="Pool2dOptions",
         fields=[("layout", "Layout", "nchw", "", {"model": "optional"}),
                 ("kernel", "u32[2]", "1", "", {"required": True}),
                 ("strides", "u32[2]", "1", "", {"py": None, "none_is": "kernel"}),
                 ("dilations", "u32[2]", "1", ""),
                 ("pads", "u32[4]", "0", "top, left, bottom, right"),
                 ("ceil_mode", "bool", "false", ""),
                 ("count_include_pad", "bool", "false", "average: divide by the whole window")]),
    dict(name="ResizeOptions",
         fields=[("mode", "ResizeMode", "nearest", ""),
                 ("coordinate", "CoordinateMode", "half_pixel", ""),
                 ("nearest", "NearestMode", "round_prefer_floor", ""),
                 ("layout", "Layout", "nchw", "", {"model": "optional"}),
                 ("scales", "f32[2]?", None, "output/input along H and W; by default y's size over x's")]),
    dict(name="ColorConvertOptions",
         fields=[("mean", "f32[3]", "0", "per R, G, B"),
                 ("scale", "f32[3]", "1", "y = (rgb - mean) * scale")]),
]

# BUILDERS: the ops:: functions of the kinds without a rule, in the order
# ops.hpp declares them. Each names its kind, its tensors in order (the
# output, "y", among them; "name?" an optional one, keyword-only in Python),
# then either `options` (its OPTIONS struct, the last parameter, with the
# fields Python takes as keywords, in that order: `keywords`) or `params`
# (plain parameters after the tensors, positional in Python: (name, type,
# Python's name), type "activation" or "u32[]", a list of indices). `doc`
# is its comment in ops.hpp and its Python docstring; `row` its row of the
# table in docs/ops.md (the op as written there, in Markdown, what it
# computes, its dtypes), or None where the row before covers it; `sample`
# (the first of a kind's builders) a small valid op for op_kinds_test: per
# tensor (dtype, shape, the value every element holds), and option values;
# or, with `builder`, an op of another builder of the kind (a map of
# ElementwiseOp), its tensors in order.
BUILDERS = [
    dict(name="matmul", kind="MatMul", tensors=["a", "b", "y"], options="MatMulOptions",
         keywords=["transpose_a", "transpose_b", "alpha", "beta", "c", "activation"],
         doc="y = activation(alpha * a @ b + beta * c). a [..., M, K], b [..., K, N], y [..., M, N]; batch "
         "dimensions broadcast as in NumPy, c broadcasts to y. a and b f32, f16 or bf16 (the same), y the same "
         "or f32; f16 and bf16 accumulate in f32. transpose_a / transpose_b swap the last two dimensions of a / b.",
         row=("`matmul(a, b, y, {transpose_a, transpose_b, alpha, beta, c, activation})`",
              "`y = act(alpha * op(a) @ op(b) + beta * c)`; a `[..., M, K]`, b `[..., K, N]`, y `[..., M, N]`; batch "
              "dimensions broadcast (NumPy); c broadcast to y",
              "a, b: f32, f16, bf16 (same); y: the same or f32; c: any float"),
         sample=dict(tensors={"a": ("f32", [2, 3], 1), "b": ("f32", [3, 4], 1), "y": ("f32", [2, 4], 0)})),
    dict(name="conv2d", kind="Conv2d", tensors=["x", "w", "y"], options="Conv2dOptions",
         keywords=["strides", "pads", "dilations", "groups", "bias", "activation", "layout", "accumulate"],
         doc="2-D cross-correlation. x [N, C, H, W] ('nchw') or [N, H, W, C] ('nhwc'), w [Cout, Cin/groups, kh, kw], "
         "bias [Cout]. strides and dilations: (h, w) or one int; pads: (top, left, bottom, right) or one int. "
         "Output size floor((in + pads - dilation*(k-1) - 1) / stride) + 1. f32, f16, bf16. accumulate: "
         "y = activation(conv + bias + y as it was).",
         row=("`conv2d(x, w, y, {layout, strides, dilations, pads, groups, bias, activation, accumulate})`",
              "cross-correlation; x `[N,C,H,W]` (NCHW) or `[N,H,W,C]` (NHWC), w `[Cout, Cin/groups, kh, kw]`, pads "
              "top, left, bottom, right; output size `floor((in + pads - dilation*(k-1) - 1) / stride) + 1`; "
              "strides and dilations 1 to 65536, pads at most 65536 (`fw::kMaxWindowValue`, as for every window "
              "op). With `accumulate`, `y = act(conv + bias + y as it was)`: y is read, then written; the addition "
              "is one f32 operation, rounded once (a residual connection's add fused into the convolution; the "
              "board needs interface 1.23; `conv_transpose2d`, `conv_integer` and `qlinear_conv` refuse it)",
              "f32, f16, bf16"),
         sample=dict(tensors={"x": ("f32", [1, 1, 3, 3], 1), "w": ("f32", [1, 1, 2, 2], 1),
                              "y": ("f32", [1, 1, 2, 2], 0)})),
    dict(name="conv_transpose2d", kind="ConvTranspose2d", tensors=["x", "w", "y"], options="Conv2dOptions",
         keywords=["strides", "pads", "dilations", "groups", "bias", "activation", "layout"],
         doc="Transposed convolution (ONNX ConvTranspose; conv2d's gradient by its input). x [N, Cin, H, W] "
         "('nchw') or [N, H, W, Cin] ('nhwc'), w [Cin, Cout/groups, kh, kw], bias [Cout]. Output height "
         "(H-1)*stride + (kh-1)*dilation + 1 - pad_top - pad_bottom + p with 0 <= p < max(stride, dilation) chosen "
         "by y's shape (ONNX's output_padding), likewise the width; pads crop the output. f32, f16, bf16; bias "
         "and activation as conv2d's.",
         row=("`conv_transpose2d(x, w, y, {layout, strides, dilations, pads, groups, bias, activation})`",
              "transposed convolution (ONNX ConvTranspose): x `[N,Cin,H,W]` (or NHWC), w `[Cin, Cout/groups, kh, "
              "kw]`; each input element scatters `x * w` to output `(ih*stride - pad_top + a*dilation, iw*stride - "
              "pad_left + b*dilation)`; output size `(in-1)*stride + (k-1)*dilation + 1 - pads + p` with `0 <= p < "
              "max(stride, dilation)` (ONNX's output_padding) set by y's shape; each output is `act(sum + bias)`, "
              "the sum taken over (input channel, kernel row, kernel column) in that order, each product rounded "
              "to f32 and added",
              "f32, f16, bf16 (computed in f32)"),
         sample=dict(tensors={"x": ("f32", [1, 1, 2, 2], 1), "w": ("f32", [1, 1, 2, 2], 1),
                              "y": ("f32", [1, 1, 3, 3], 0)})),
    dict(name="max_pool2d", kind="Pool2d", tensors=["x", "y"], options="Pool2dOptions",
         keywords=["kernel", "strides", "pads", "dilations", "ceil_mode", "layout"],
         doc="Window maximum over H and W (strides default to the kernel). Floats, i8, u8.",
         row=("`max_pool2d`, `avg_pool2d` (x, y, {kernel, strides, dilations, pads, ceil_mode, count_include_pad})",
              "window max / mean; kernel, strides and dilations 1 to 65536, each pad below the dilated window; every "
              "window has a tap inside x; padding never enters a max; with `ceil_mode` a last window that would "
              "start in the end padding is dropped; `count_include_pad` divides by the window clipped to the "
              "padded input, otherwise by the valid elements",
              "max: floats, i8, u8; average: floats"),
         sample=dict(tensors={"x": ("f32", [1, 1, 2, 2], 1), "y": ("f32", [1, 1, 1, 1], 0)},
                     options={"kernel": [2, 2], "strides": [2, 2]})),
    dict(name="avg_pool2d", kind="Pool2d", tensors=["x", "y"], options="Pool2dOptions",
         keywords=["kernel", "strides", "pads", "dilations", "ceil_mode", "count_include_pad", "layout"],
         doc="Window mean over H and W (strides default to the kernel). Floats.", row=None),
    dict(name="activation", kind="Elementwise", tensors=["x", "y"], params=[("act", "activation", "activation")],
         doc="y = activation(x) elementwise (a tpuhal.Activation, or in Python a name such as 'sigmoid'). Floats.",
         row=("`activation(x, y, act)`, `relu(x, y)`", "elementwise activation (below)", "floats"),
         sample=dict(builder="add", tensors={"a": ("f32", [4], 1), "b": ("f32", [4], 1), "y": ("f32", [4], 0)})),
    dict(name="relu", kind="Elementwise", tensors=["x", "y"], params=[],
         doc="y = relu(x) elementwise: activation(x, y, relu). Floats.", row=None),
    dict(name="cast", kind="Elementwise", tensors=["x", "y"], params=[],
         doc="y = x converted to y's dtype (x broadcast to y's shape): floats round to nearest even, float to "
         "integer rounds toward zero and saturates.",
         row=("`cast(x, y)`", "conversion to y's dtype (x broadcast to y)", "any to any")),
    dict(name="transpose", kind="Elementwise", tensors=["x", "y"], params=[("perm", "u32[]", "perm")],
         doc="y = x with dimensions permuted: y dim i is x dim perm[i].",
         row=("`transpose(x, y, perm)`", "y dim i is x dim perm[i]", "any")),
    dict(name="conv_integer", kind="ConvInteger", tensors=["x", "w", "y", "x_zero_point?", "w_zero_point?"],
         options="Conv2dOptions", keywords=["strides", "pads", "dilations", "groups", "layout"],
         doc="y (i32) = conv2d(x - x_zero_point, w - w_zero_point); x and w i8 or u8; w's zero point a scalar or "
         "one per output channel.",
         row=("`conv_integer(x, w, y, x_zp, w_zp, options)`",
              "`conv(x - x_zp, w - w_zp)` in int32; padding contributes 0; w_zp scalar or per output channel",
              "x, w: i8, u8; y: i32"),
         sample=dict(tensors={"x": ("u8", [1, 1, 3, 3], 2), "w": ("u8", [1, 1, 2, 2], 2),
                              "y": ("i32", [1, 1, 2, 2], 0)})),
    dict(name="qlinear_conv", kind="QLinearConv",
         tensors=["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "y"],
         options="Conv2dOptions", keywords=["strides", "pads", "dilations", "groups", "bias", "layout"],
         doc="Requantised conv_integer plus an i32 bias (ONNX QLinearConv); w's scale and zero point a scalar or "
         "one per output channel.",
         row=("`qlinear_conv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, y, options)`",
              "requantised `conv_integer` plus int32 bias; w's scale/zp scalar or per output channel. With no input "
              "channels it fails when it runs on a simulated board, naming x's channel dimension: its scales are "
              "views over x and w, which then hold nothing (`conv_integer` gives 0s)",
              "i8, u8; scales f32; bias i32"),
         sample=dict(tensors={"x": ("u8", [1, 1, 3, 3], 2), "x_scale": ("f32", [], 1), "x_zero_point": ("u8", [], 0),
                              "w": ("u8", [1, 1, 2, 2], 2), "w_scale": ("f32", [], 1),
                              "w_zero_point": ("u8", [], 0), "y_scale": ("f32", [], 1),
                              "y_zero_point": ("u8", [], 1), "y": ("u8", [1, 1, 2, 2], 0)})),
    dict(name="resize", kind="Resize", tensors=["x", "y"], options="ResizeOptions",
         keywords=["mode", "coordinate", "nearest", "layout", "scales"],
         doc="Resizes H and W of a 4-D tensor as ONNX Resize does: mode 'nearest' or 'linear'; scales (h, w) default "
         "to y's size over x's.",
         row=("`resize(x, y, {mode, coordinate, nearest, layout, scales})`",
              "ONNX Resize over H and W of a 4-D tensor: nearest (round_prefer_floor/ceil, floor, ceil) or bilinear "
              "(edges replicated); coordinates half_pixel, asymmetric, align_corners, pytorch_half_pixel, "
              "tf_half_pixel_for_nn; align_corners and pytorch_half_pixel use `in * scale` (unrounded) as the "
              "resized length; scales default to y/x",
              "floats, i8, u8"),
         sample=dict(tensors={"x": ("f32", [1, 1, 2, 2], 1), "y": ("f32", [1, 1, 4, 4], 0)})),
    dict(name="nv12_to_rgb", kind="ColorConvert", tensors=["luma", "chroma", "y"], options="ColorConvertOptions",
         keywords=["mean", "scale"],
         doc="NV12 (luma [H, W] u8, chroma [H/2, W/2, 2] u8) to planar RGB y [3, H, W] (f32, f16, bf16 or u8), "
         "BT.601 limited range, then (rgb - mean) * scale per channel.",
         row=("`nv12_to_rgb`, `i420_to_rgb` (planes, y, {mean, scale})",
              "BT.601 limited range: `R = 1.164(Y-16) + 1.596(V-128)`, `G = 1.164(Y-16) - 0.813(V-128) - "
              "0.391(U-128)`, `B = 1.164(Y-16) + 2.018(U-128)`, clamped to [0, 255], then `(v - mean[c]) * "
              "scale[c]`; chroma per 2x2 block",
              "planes u8; y `[3, H, W]` floats or u8"),
         sample=dict(tensors={"luma": ("u8", [2, 2], 100), "chroma": ("u8", [1, 1, 2], 128),
                              "y": ("f32", [3, 2, 2], 0)})),
    dict(name="i420_to_rgb", kind="ColorConvert", tensors=["luma", "u", "v", "y"], options="ColorConvertOptions",
         keywords=["mean", "scale"],
         doc="I420 (luma [H, W], u and v [H/2, W/2], u8) to planar RGB y [3, H, W], as nv12_to_rgb.", row=None),
]
