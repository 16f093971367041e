/* The dump as the viewer reads it: parsing and checking the file, decoding its events, the
 * module tree with per-phase numbers, and the embedded predictions.
 */

const SCHEMA_VERSIONS = [1, 2, 3];
// torch/distributed/tensor/debug/_comm_mode.py's trivial_ops: reference dumps don't carry
// the list that noise levels 1-2 leave out; ours do (commdebug.trivial_ops).
const REFERENCE_TRIVIAL_OPS = [
  "aten.detach.default", "aten.t.default", "aten.view.default",
  "aten._to_copy.default", "aten.as_strided.default", "aten.transpose.int",
];
const OP_LISTS = {
  forward: "operations_forward", backward: "operations_backward",
  checkpoint: "operations_checkpointing", optimizer: "operations_optimizer",
};

function parseDump(text) {
  let dump;
  try {
    dump = JSON.parse(text);
  } catch (e) {
    throw new DumpError("This file is not valid JSON.", e.message);
  }
  if (!isObj(dump) || typeof dump.fqn !== "string" || !Array.isArray(dump.children)) {
    throw new DumpError("This JSON is not a CommDebugMode dump.",
      'A dump is an object with an "fqn" string and a "children" list at its root.');
  }
  if ("commdebug" in dump) {
    const version = isObj(dump.commdebug) ? dump.commdebug.schema_version : undefined;
    if (!SCHEMA_VERSIONS.includes(version)) {
      throw new DumpError(
        `Unsupported commdebug schema_version ${JSON.stringify(version) ?? "(missing)"}.`,
        `This viewer reads schema versions ${SCHEMA_VERSIONS.slice(0, -1).join(", ")} and ${SCHEMA_VERSIONS.at(-1)}; ` +
        "open the file with the commdebug version that wrote it.");
    }
  }
  return dump;
}

// ---------------------------------------------------------------- events

// CollectiveEvent's fields (commdebug/model/trace.py); schema 2 stores them by column.
const EVENT_FIELDS = [
  "index", "op", "key", "aten_op", "step", "phase", "module", "group", "seq", "dtype",
  "input_shapes", "output_shapes", "input_bytes", "output_bytes", "size_bytes", "busbw_factor",
  "dtensor_op", "placements", "mesh", "source", "latency_s", "peer", "p2p_seq", "microbatch",
  "start_s", "in_flight", "error", "unit", "compiled", "send_splits", "recv_splits",
];
// all_to_all's bytes per member, and the bytes an EVEN marker splits by the group's size
const SPLIT_TOTALS = {send_splits: "input_bytes", recv_splits: "output_bytes"};
const EVEN_SPLIT = -1;
// Columns holding string-table indices; the shapes hold the index of their JSON text.
const TEXT_FIELDS = new Set(["op", "key", "aten_op", "phase", "module", "group", "dtype",
  "dtensor_op", "placements", "mesh", "source", "error", "unit", "input_shapes", "output_shapes"]);

/**
 * The dump's events as one plain object each, `group` as {name, size}: schema 1 lists objects
 * (the group inline), schema 2 has {count, strings, columns}. null when the dump has none.
 * Shapes stay text (schema 2) or arrays (schema 1) until the detail shows them.
 */
function decodeEvents(cd) {
  const raw = cd ? cd.events : null;
  if (Array.isArray(raw)) {
    return raw.filter(isObj).map((e) => {
      const g = isObj(e.group) ? e.group : {name: e.group};
      return Object.assign({}, e, {group: {name: g.name == null ? null : str(g.name), size: optNum(g.size)}});
    });
  }
  if (!isObj(raw)) return null;
  if (!isObj(raw.columns) || !Array.isArray(raw.strings)) {
    throw new DumpError("Malformed events in this dump.",
      'Events by column (schema 2 and 3) need "count", "strings" and "columns".');
  }
  const {columns, strings} = raw;
  const count = Number.isInteger(raw.count) ? raw.count : arr(columns.index).length;
  const groups = isObj(cd.groups) ? cd.groups : {};
  const cols = EVENT_FIELDS.map((name) => [name, Array.isArray(columns[name]) ? columns[name] : null,
    TEXT_FIELDS.has(name)]);
  const text = (i) => (Number.isInteger(i) && i >= 0 && i < strings.length ? str(strings[i]) : null);
  // the block's splits table: each distinct vector once, as [unit, k0, k1, ...] (bytes = unit x k)
  const table = arr(raw.splits).map((packed) => arr(packed).slice(1).map((k) => num(packed[0]) * num(k)));
  const events = new Array(count);
  for (let i = 0; i < count; i++) {
    const e = {};
    for (const [name, values, isText] of cols) {
      const v = values ? values[i] : undefined;
      e[name] = isText ? text(v) : v ?? null;
    }
    const g = e.group == null ? null : groups[e.group];
    e.group = {name: e.group, size: isObj(g) ? optNum(g.size) : null};
    for (const [name, total] of Object.entries(SPLIT_TOTALS)) e[name] = splitsOf(e[name], table, num(e[total]), e.group.size);
    e.in_flight = e.in_flight === true;
    e.compiled = e.compiled === true;
    events[i] = e;
  }
  return events;
}

/** A split column's value as bytes per member: null, EVEN (the total over the group's size) or
 * an index into the block's table. */
function splitsOf(v, table, total, size) {
  if (v === EVEN_SPLIT) return size > 0 ? new Array(size).fill(total / size) : null;
  if (Number.isInteger(v) && v >= 0 && v < table.length) return table[v];
  return Array.isArray(v) ? v.map(num) : null;  // schema 1 lists them inline
}

// ---------------------------------------------------------------- predictions

/**
 * The predictions Python embedded with the dump (visualizer.predictions_data), checked:
 * {cluster, notes, total_s, events, modules, lines}, or null. Never computed here: the model
 * lives in commdebug.estimate, so a dump dropped on the page shows none.
 */
function readPredicted(raw) {
  if (!isObj(raw) || typeof raw.cluster !== "string") return null;
  return {
    cluster: raw.cluster, notes: arr(raw.notes).map(str), total: optNum(raw.total_s),
    events: arr(raw.events), modules: isObj(raw.modules) ? raw.modules : {},
    lines: isObj(raw.lines) ? raw.lines : {},
  };
}

/** Predicted seconds of a module in a phase (descendants included), or of all its phases. */
function predOf(pred, node, phase) {
  const m = pred.modules[node.fqn];
  if (!isObj(m)) return null;
  return phase ? optNum(m[phase]) : PHASES.some((p) => optNum(m[p]) != null) ? sum(PHASES.map((p) => optNum(m[p]))) : null;
}

// ---------------------------------------------------------------- model

function buildModel(dump, predicted) {
  const cd = isObj(dump.commdebug) ? dump.commdebug : null;
  const nodes = [];
  // Iterative: a hostile file may nest deeper than the JS stack.
  const stack = [{raw: dump, parent: null}];
  while (stack.length) {
    const {raw, parent} = stack.pop();
    const node = makeNode(raw, parent, nodes.length);
    nodes.push(node);
    const kids = arr(raw.children).filter(isObj);
    for (let i = kids.length - 1; i >= 0; i--) stack.push({raw: kids[i], parent: node});
  }
  const root = nodes[0];
  const byBytes = root.totalBytes != null;
  const events = decodeEvents(cd);
  const pred = readPredicted(predicted);
  // Per-event predictions follow the dump's event order; a count that differs means they
  // were written for another file, so none is shown rather than wrong ones.
  if (pred && events && pred.events.length === events.length) {
    events.forEach((e, i) => { e.predicted_s = optNum(pred.events[i]); });
  } else if (pred) {
    pred.events = null;
  }
  return {
    cd, nodes, root, events, pred,
    reference: cd === null,
    byFqn: indexByFqn(nodes),
    trivial: new Set(cd && Array.isArray(cd.trivial_ops) ? cd.trivial_ops : REFERENCE_TRIVIAL_OPS),
    noiseLevel: cd && Number.isInteger(cd.noise_level) ? cd.noise_level : null,
    // Share bars compare with everything Global saw: bytes when recorded, else call counts.
    shareOf: byBytes ? (n) => n.totalBytes : (n) => n.totalCount,
    shareTotal: byBytes ? root.totalBytes : root.totalCount,
    shareUnit: byBytes ? "bytes" : "calls",
  };
}

function makeNode(raw, parent, idx) {
  const fqn = typeof raw.fqn === "string" ? raw.fqn : "(unnamed)";
  const extra = isObj(raw.commdebug_node) ? raw.commdebug_node : null;
  let counts, bytes = null, unknown = null;
  if (extra && isObj(extra.counts)) {
    counts = perPhase(extra.counts);
    // schema 3: a phase's bytes are null where no call's size is known, and unknown_size counts
    // the calls they leave out
    if (isObj(extra.bytes)) bytes = Object.fromEntries(PHASES.map((p) => [p, optNum(extra.bytes[p])]));
    unknown = perPhase(isObj(extra.unknown_size) ? extra.unknown_size : {});
  } else {
    // Reference node: its backward includes checkpoint recompute, which it cannot separate.
    counts = {
      forward: sum(arr(raw.collectives_forward).map((p) => num(arr(p)[1]))),
      backward: sum(arr(raw.collectives_backward).map((p) => num(arr(p)[1]))),
      checkpoint: null, optimizer: null,
    };
  }
  return treeNode(idx, fqn, parent, {
    raw, counts, bytes, unknown,
    totalCount: sum(Object.values(counts)),
    // the known sizes' sum; null where none is known (every call's size unknown)
    totalBytes: bytes && (unknown && sum(Object.values(unknown)) >= sum(Object.values(counts)) && sum(Object.values(counts)) > 0
      ? null : sum(Object.values(bytes).map(num))),
    totalUnknown: unknown ? sum(Object.values(unknown)) : 0,
    opTotals: null,  // Map op -> calls, filled on first use by the op filter
  });
}

/**
 * A node of either page's tree, added to its parent's children: the tree view reads its place
 * (idx, depth, label: its name under its parent) and numbers (`fields`: raw, counts, bytes...).
 */
function treeNode(idx, fqn, parent, fields) {
  const node = {
    idx, fqn, parent, children: [],
    depth: parent ? parent.depth + 1 : 0,
    label: parent && fqn.startsWith(parent.fqn + ".") ? fqn.slice(parent.fqn.length + 1) : fqn,
    ...fields,
  };
  if (parent) parent.children.push(node);
  return node;
}

/** Each node by its fqn, for links from events and findings to the tree. */
const indexByFqn = (nodes) => new Map(nodes.map((n) => [n.fqn, n]));

function perPhase(obj) {
  return Object.fromEntries(PHASES.map((p) => [p, num(obj[p])]));
}

/** The node's collectives (descendants included) as {op, phase, count, bytes, group}. */
function collectivesOf(node, model) {
  const extra = node.raw.commdebug_node;
  if (isObj(extra) && Array.isArray(extra.collectives)) {
    return extra.collectives.filter(isObj).map((c) => ({
      op: str(c.op ?? c.key), phase: str(c.phase), count: num(c.count), bytes: optNum(c.bytes), unknown: num(c.unknown_size),
      group: c.group == null ? null : groupLabel(model, c.group, c.group_size),
      // the table line's key, as visualizer.predictions_data writes it
      line: `${str(c.phase)}\t${str(c.key ?? c.op)}\t${str(c.group)}`,
    }));
  }
  // Reference node: op keys per phase, nothing on bytes or groups.
  return ["forward", "backward"].flatMap((phase) =>
    arr(node.raw["collectives_" + phase]).filter(Array.isArray).map((p) => ({
      op: str(p[0]), phase, count: num(p[1]), bytes: null, group: null,
    })));
}

/** "mesh_tp[4]": a group by its description and size (schema 2 keeps a table of groups). */
function groupLabel(model, name, size) {
  if (str(name) === "?") return "unknown";  // a group the data does not name (commdebug.model.trace.UNKNOWN_LABEL)
  const g = model && model.cd && isObj(model.cd.groups) && isObj(model.cd.groups[str(name)])
    ? model.cd.groups[str(name)] : {};
  const desc = str(g.desc);
  const n = g.size ?? size;
  const base = desc && desc !== "undefined" ? desc : `group ${str(name)}`;
  return n ? `${base}[${str(n)}]` : base;
}

function opTotals(node) {
  if (!node.opTotals) {
    node.opTotals = new Map();
    for (const c of collectivesOf(node, null)) node.opTotals.set(c.op, (node.opTotals.get(c.op) || 0) + c.count);
  }
  return node.opTotals;
}

/** Calls of `op` the module issues itself: its counts include its children's. */
function directCalls(node, op) {
  return node.children.reduce((left, c) => left - (opTotals(c).get(op) || 0), opTotals(node).get(op) || 0);
}

/** Totals for the header: commdebug.summary, else (reference dump) Global's counts. */
function runTotals(model) {
  const s = model.cd && isObj(model.cd.summary) ? model.cd.summary : null;
  if (s) {
    const byOp = Object.entries(isObj(s.by_op) ? s.by_op : {}).map(([op, v]) =>
      ({op, count: num(v && v.count), bytes: optNum(v && v.bytes), unknown: num(v && v.unknown_size)}));
    return {count: num(s.collectives), bytes: optNum(s.bytes), unknown: num(s.unknown_size), byOp};
  }
  const byOp = new Map();
  for (const c of collectivesOf(model.root, model)) {
    const e = byOp.get(c.op) || {op: c.op, count: 0, bytes: null};
    e.count += c.count;
    if (c.bytes != null) e.bytes = (e.bytes || 0) + c.bytes;
    byOp.set(c.op, e);
  }
  return {count: model.root.totalCount, bytes: model.root.totalBytes, byOp: [...byOp.values()]};
}

/**
 * The node's op rows kept at noise `level` (0 none; 1 DTensor rows; 2 all rows; 1-2 leave
 * trivial ops out), identical rows merged: reference dumps repeat a row per call.
 */
function opRows(model, node, level) {
  const rows = new Map();
  if (level <= 0) return [];
  for (const phase of PHASES) {
    for (const r of arr(node.raw[OP_LISTS[phase]])) {
      if (!isObj(r)) continue;
      const name = str(r.name);
      const sharding = arr(r.input_sharding).map(str);
      if ((level < 3 && model.trivial.has(name)) || (level < 2 && sharding.length === 0)) continue;
      const shapes = arr(r.input_shape).map(str), mesh = str(r.device_mesh);
      const key = JSON.stringify([phase, name, shapes, sharding, mesh]);
      if (!rows.has(key)) rows.set(key, {phase, name, shapes, sharding, mesh, count: 0});
      rows.get(key).count += r.count == null ? 1 : num(r.count);
    }
  }
  return [...rows.values()];
}
