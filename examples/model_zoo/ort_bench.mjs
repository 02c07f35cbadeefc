// Times an ONNX model on ONNX Runtime's CPU execution provider, for
// zoo.py --ort. ONNX Runtime is not a Debian package: it comes from npm's
// onnxruntime-node, installed without its install script (which fetches
// GPU parts):
//
//   mkdir ort && cd ort && npm init -y && npm install --ignore-scripts onnxruntime-node
//
// Usage:
//   node ort_bench.mjs --modules DIR --model M.onnx --input X.bin --shape 1x3x224x224
//                      [--output Y.bin] [--threads N] [--seconds S] [--profile PREFIX]
//
// X.bin holds the model's one float32 input, row-major. The script writes
// the first output's float32 values to Y.bin, then runs the model for S
// seconds after one warm-up run, once with IEEE arithmetic and once with
// denormals flushed to zero (the faster counts, as zoo.py does for
// PyTorch), and prints one JSON line: {"images_per_s", "ieee", "flush",
// "version", "profile"}. --profile writes ONNX Runtime's own per-node
// profile (a Chrome trace) of the IEEE session and names it in the JSON.

import { createRequire } from "node:module";
import { readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { performance } from "node:perf_hooks";

function parse(argv) {
  const args = { threads: 2, seconds: 2 };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i];
    const value = argv[i + 1];
    if (!key.startsWith("--") || value === undefined) {
      throw new Error(`bad argument '${key}': every option takes a value`);
    }
    args[key.slice(2)] = value;
  }
  for (const needed of ["modules", "model", "input", "shape"]) {
    if (!(needed in args)) throw new Error(`--${needed} is required`);
  }
  args.threads = Number(args.threads);
  args.seconds = Number(args.seconds);
  args.shape = args.shape.split("x").map(Number);
  if (args.shape.some((d) => !Number.isInteger(d) || d <= 0)) {
    throw new Error(`--shape must be dimensions such as 1x3x224x224`);
  }
  return args;
}

async function timed(ort, args, flush, profile) {
  const options = {
    intraOpNumThreads: args.threads,
    interOpNumThreads: 1,
    executionMode: "sequential",
    graphOptimizationLevel: "all",
    extra: { session: { set_denormal_as_zero: flush ? "1" : "0" } },
  };
  if (profile) {
    options.enableProfiling = true;
    options.profileFilePrefix = profile;
  }
  const session = await ort.InferenceSession.create(args.model, options);
  const bytes = readFileSync(args.input);
  const data = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  const count = args.shape.reduce((a, b) => a * b, 1);
  if (data.length !== count) {
    throw new Error(`${args.input} holds ${data.length} floats; shape ${args.shape.join("x")} needs ${count}`);
  }
  const feeds = { [session.inputNames[0]]: new ort.Tensor("float32", data, args.shape) };
  const first = await session.run(feeds);
  const out = first[session.outputNames[0]];
  if (args.output && !flush) {
    writeFileSync(args.output, Buffer.from(out.data.buffer, out.data.byteOffset, out.data.byteLength));
  }
  let runs = 0;
  const start = performance.now();
  let elapsed = 0;
  while (elapsed < args.seconds * 1000) {
    await session.run(feeds);
    runs += 1;
    elapsed = performance.now() - start;
  }
  let file = null;
  if (profile) file = session.endProfiling();
  await session.release();
  // onnxruntime-node's endProfiling() returns nothing (1.31): the file is
  // the newest PREFIX_<date>.json beside the prefix.
  if (profile && typeof file !== "string") file = newestProfile(profile);
  return { rate: (runs * args.shape[0] * 1000) / elapsed, file };
}

function newestProfile(prefix) {
  const dir = dirname(resolve(prefix));
  const start = `${basename(prefix)}_`;
  let best = null;
  let bestTime = -1;
  for (const name of readdirSync(dir)) {
    if (!name.startsWith(start) || !name.endsWith(".json")) continue;
    const time = statSync(join(dir, name)).mtimeMs;
    if (time > bestTime) {
      best = join(dir, name);
      bestTime = time;
    }
  }
  return best;
}

// One line on stderr for any failure (a model ONNX Runtime refuses, a bad
// argument), so that callers can quote it: Node's own report of an
// uncaught error ends with its version, not the error.
try {
  const args = parse(process.argv.slice(2));
  const require = createRequire(join(resolve(args.modules), "node_modules", "_"));
  const ort = require("onnxruntime-node");
  const ieee = await timed(ort, args, false, args.profile);
  const flush = await timed(ort, args, true, null);
  const version = require("onnxruntime-node/package.json").version;
  console.log(JSON.stringify({
    images_per_s: Math.max(ieee.rate, flush.rate),
    ieee: ieee.rate,
    flush: flush.rate,
    version,
    profile: ieee.file,
  }));
} catch (e) {
  console.error(`ort_bench: ${String(e.message ?? e).split("\n")[0]}`);
  process.exit(1);
}
