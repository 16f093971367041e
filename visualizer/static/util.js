/* commdebug viewer: renders one commdebug or CommDebugMode JSON dump (docs/json-format.md), or
 * a folder of per-rank dumps.
 *
 * visualizer/assets.py joins these files, in the order it lists, into the page's one inline
 * script: a single scope, so each file uses the names the earlier ones declare.
 *
 * Everything in a dump is untrusted: module names and placements come from user code. DOM is
 * built with createElement/textContent only, never innerHTML, and names never go into selectors.
 * Dumps reach thousands of modules and tens of thousands of op rows, so the tree builds a node's
 * children on first expand and tables render a page of rows at a time.
 */

const PHASES = ["forward", "backward", "checkpoint", "optimizer"];
const PHASE_SHORT = {forward: "fwd", backward: "bwd", checkpoint: "ckpt", optimizer: "opt"};

const $ = (id) => document.getElementById(id);
const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const arr = (v) => (Array.isArray(v) ? v : []);
const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : 0);
const optNum = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);
const str = (v) => (v == null ? "" : typeof v === "string" ? v : JSON.stringify(v));
const sum = (values) => values.reduce((a, b) => a + (b || 0), 0);

/** Exact times as the folder page embeds them (visualizer.exact_floats): "<kinds>:<doubles>",
 * runs of kinds ("3f": three values from the doubles, "z" a zero, "n" none) and the base64 of
 * the values' IEEE doubles, little-endian. Anything malformed: null. */
function decodeFloats(text) {
  if (typeof text !== "string") return null;
  const colon = text.indexOf(":");
  let raw;
  try { raw = atob(text.slice(colon + 1)); } catch (e) { return null; }
  if (colon < 0 || raw.length % 8) return null;
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  const view = new DataView(bytes.buffer), out = [];
  let next = 0;
  for (const [, count, kind] of text.slice(0, colon).matchAll(/(\d*)([fzn])/g)) {
    for (let k = count ? Number(count) : 1; k > 0; k--) {
      if (kind === "f") {
        if (8 * next >= raw.length) return null;
        out.push(view.getFloat64(8 * next++, true));
      } else out.push(kind === "z" ? 0 : null);
    }
  }
  return 8 * next === raw.length ? out : null;
}

/** Element with props (class, on<event>, else attributes) and children (nodes, or strings as text). */
function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value == null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) if (child != null) el.append(child);
  return el;
}

/** A file or page the viewer cannot show: `message` says so, `detail` says why. */
class DumpError extends Error {
  constructor(title, detail) { super(title); this.detail = detail; }
}

// ---------------------------------------------------------------- formatting

// Not toLocaleString: its first call loads locale data, a visible cost on the first draw.
const fmtCount = (n) => (n == null ? "—" : String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ","));

/** "3 findings", "1 match": a count and its noun, which takes `plural` unless it is 1. */
const counted = (n, noun, plural = "s") => `${fmtCount(n)} ${noun}${n === 1 ? "" : plural}`;

function fmtBytes(n) {
  if (n == null) return "—";
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = n / 1024, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(v < 100 ? 1 : 0)} ${units[i]}`;
}

/** The median of sorted numbers as Python's statistics.median takes it (the mean of the two
 * middle values of an even count): the page and `commdebug summary` give one median for the
 * same calls. */
function median(sorted) {
  const n = sorted.length;
  if (!n) return null;
  const mid = Math.floor(n / 2);
  return n % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

/** A call's size: "?" where the data does not give it (null in a schema-3 dump), never "0 B". */
const fmtSize = (n) => (optNum(n) == null ? "?" : fmtBytes(n));

/** A sum of sizes that leaves out `unknown` calls of unknown size: "1.0 KiB (+3 ?)", "?" when
 * no size is known, "—" for no calls at all (commdebug.units.format_known_bytes). */
function fmtKnownBytes(n, unknown = 0) {
  if (optNum(n) == null) return unknown ? "?" : "—";
  return unknown ? `${fmtBytes(n)} (+${fmtCount(unknown)} ?)` : fmtBytes(n);
}

const TIME_UNITS = [["s", 1], ["ms", 1e-3], ["us", 1e-6], ["ns", 1e-9]];

/** A duration to 3 significant digits, as precise as it was measured: "779 ms", "3.79 s",
 * "12.5 us" (commdebug.units.format_duration; data-* attributes keep the exact figure). */
function fmtSeconds(s) {
  if (optNum(s) == null) return "—";
  const rounded = Number(s.toPrecision(3));  // first, so 0.9996 s reads "1.00 s", not "1000 ms"
  if (rounded === 0) return "0 s";
  const [unit, scale] = TIME_UNITS.find(([, k]) => Math.abs(rounded) >= k) || TIME_UNITS.at(-1);
  const v = Number((rounded / scale).toPrecision(3)), size = Math.abs(v);
  const text = size >= 1000 ? (s / scale).toFixed(0) : size < 1 ? String(v) : v.toFixed(size >= 100 ? 0 : size >= 10 ? 1 : 2);
  return `${text} ${unit}`;
}

/** A moment as seconds from the recording's start, to the millisecond: an offset orders events,
 *  so it keeps the digits a duration drops ("1234.567 s", not "1.23 ks"). */
function fmtOffset(s) {
  return optNum(s) == null ? "—" : `${s.toFixed(3)} s`;
}

/** A shapes field as text: "[16384, 4096]" per tensor, or "—". */
function fmtShapes(v) {
  let shapes = v;
  if (typeof v === "string") {
    try { shapes = JSON.parse(v); } catch (e) { return v; }
  }
  const list = arr(shapes).map((s) => `[${arr(s).map(str).join(", ")}]`);
  return list.length ? list.join(" ") : "—";
}

// "class 'torch.nn.modules.linear.Linear'" -> "Linear"
const shortType = (t) => str(t).replace(/^class '(.*)'$/, "$1").split(".").pop();
