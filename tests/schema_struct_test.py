#!/usr/bin/python3
"""The op schema's attribute structs (ATTR_STRUCTS in schema/ops.py): the
generator refuses a struct it cannot write, naming the struct and field,
and writes the wire and HAL views of each field type as docs/adding-an-op.md
says. A kind without a rule names its shape rule (SHAPE_RULES).

  tests/schema_struct_test.py ROOT
"""

import os
import sys


def main(root):
    sys.dont_write_bytecode = True
    sys.path.insert(0, os.path.join(root, "schema"))
    import generate  # noqa: E402
    import ops  # noqa: E402

    failures = []

    def expect(what, ok):
        if not ok:
            failures.append(what)

    # Every struct of the schema passes.
    for st in ops.ATTR_STRUCTS:
        expect(f"{st['name']} refused: {generate.check_struct(st)}", generate.check_struct(st) == [])

    def refused(fields, words=None, says=""):
        st = dict(name="T", doc="", fields=fields)
        if words is not None:
            st["words"] = words
        problems = generate.check_struct(st)
        expect(f"{fields} (words {words}) was taken", problems != [])
        expect(f"{fields}: {problems} do not say {says!r}", any(says in p for p in problems))

    refused([("a", "u16", "0", "")], says="T.a: type 'u16'")
    refused([("a", "u32[0]", "1", "")], says="T.a: type 'u32[0]'")
    refused([("a", "u32[2]", "x", "")], says="T.a: a u32's default")
    refused([("a", "f32[3]", "1e5", "")], says="T.a: an f32's default")
    refused([("a", "bool", "1", "")], says="T.a: a bool's default")
    refused([("a", "Layout", "chw", "")], says="T.a: its default 'chw'")
    refused([("a", "PoolKind", "max", "")], says="declared in fw and hal (or driver) alone")
    refused([("a", "Layout", "nchw", "", {"hal_bool": "nchw", "hal": "b"}), ("b", "u32", "0", "")],
            says="field names must differ")
    refused([("a", "Activation", "none", "", {"hal": "b", "hal_bool": "relu"})],
            says="an enumeration of two")
    refused([("a", "activation", "relu", "")], says="T.a: a field of type activation takes the default none")
    refused([("a", "reserved", "0", "", {"hal": "b"})], says="T.a: a field of type reserved takes the default 0 and no HAL view")
    refused([("a", "u32", "0", "", {"name": "b"})], says="hal, hal_bool, params and minor only")
    refused([("a", "u32", "0", "", {"minor": 2})], says="T.a: minor (the interface minor a field came in) is for "
            "a bool field")
    refused([("a", "bool", "false", "", {"minor": len(ops.MINORS) + 1})], says="a minor MINORS lists")
    refused([("a", "activation", "none", "", {"params": ("alpha",)})], says="the wire names of its two parameter")
    refused([("a", "activation", "none", "", {"params": ("b", "c")}), ("b", "u32", "0", "")],
            says="field names must differ")
    refused([("a", "u32[4]", "0", ""), ("b", "activation", "none", "")], words=6,
            says="6 words do not hold its fields' 7")

    # A bool field a later minor added: that minor where it is set.
    expect("a later field's minor in required_minor",
           "static_cast<std::uint16_t>(a.accumulate ? 23 : 1)" in generate.attr_minors())

    # The views each type gets.
    conv = next(st for st in ops.ATTR_STRUCTS if st["name"] == "ConvAttrs")
    fields = {f["name"]: f for f in generate.attr_fields(conv)}
    expect("u32[2] in the HAL", generate.hal_field(fields["stride"]).startswith(
        "  std::array<std::uint32_t, 2> strides{1, 1};"))
    expect("u32[2] on the wire", generate.fw_field(fields["stride"]).startswith("  std::uint32_t stride[2];"))
    expect("an activation's three words",
           generate.encode_field(fields["activation"]) ==
           "  a.activation = static_cast<std::uint32_t>(from.activation.kind);\n"
           "  a.act_alpha = from.activation.alpha;\n  a.act_beta = from.activation.beta;\n")
    elementwise = {f["name"]: f for f in generate.attr_fields(
        next(st for st in ops.ATTR_STRUCTS if st["name"] == "ElementwiseAttrs"))}
    expect("an activation's parameter words named on the wire",
           generate.fw_field(elementwise["activation"]).endswith("  float alpha, beta;  // its parameters\n") and
           generate.encode_field(elementwise["activation"]).endswith(
               "  a.alpha = from.activation.alpha;\n  a.beta = from.activation.beta;\n"))
    expect("an enumeration declared in fw and driver", generate.hal_field(elementwise["op"]) ==
           "  ElementwiseOp op = ElementwiseOp::Identity;\n")
    pool = next(st for st in ops.ATTR_STRUCTS if st["name"] == "PoolAttrs")
    kind = generate.attr_fields(pool)[0]
    # PoolKind: Max is 0, Average 1; the HAL's max == true is Max.
    expect("hal_bool's encoding", generate.encode_field(kind).startswith("  a.kind = from.max ? 0u : 1u;"))
    expect("hal_bool's declaration, saying what true stands for",
           generate.hal_field(kind) == "  bool max = true;  // true: PoolKind max\n")
    color = next(st for st in ops.ATTR_STRUCTS if st["name"] == "ColorConvertAttrs")
    expect("a struct's own size", generate.struct_words(color) == (8, 14))
    expect("a reserved word is not in the HAL", generate.hal_field(generate.attr_fields(color)[1]) == "")
    expect("the default size, a multiple of 16 bytes",
           generate.struct_words(dict(name="T", fields=[("a", "u32[4]", "0", ""), ("b", "u32", "0", "")])) == (5, 8))

    # A kind has a rule, or names where its shape rule lives; never both.
    def schema_refuses(change, says):
        kinds = ops.KINDS
        ops.KINDS = [dict(k) for k in kinds]
        change(ops.KINDS)
        try:
            generate.check_schema()
            expect(f"a schema broken for {says!r} was taken", False)
        except SystemExit as e:
            expect(f"{e} does not say {says!r}", says in str(e))
        finally:
            ops.KINDS = kinds
    schema_refuses(lambda ks: ks[1].pop("shape"), "Conv2d: a kind has a rule, or names its shape rule")
    schema_refuses(lambda ks: ks[1].update(shape="stencil"), "Conv2d: a kind has a rule, or names its shape rule")
    schema_refuses(lambda ks: ks[4].update(shape="window"), "Softmax: a kind has a rule, or names its shape rule")

    for f in failures:
        print(f"schema_struct_test: {f}", file=sys.stderr)
    if not failures:
        print("schema_struct_test: ok")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip())
    sys.exit(main(sys.argv[1]))
