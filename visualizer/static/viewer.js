/* commdebug viewer: renders one commdebug or CommDebugMode JSON dump (docs/json-format.md).
 *
 * Everything in a dump is untrusted: module names and placements come from user code. DOM is
 * built with createElement/textContent only, never innerHTML, and names never go into selectors.
 * Dumps reach thousands of modules and tens of thousands of op rows, so the tree builds a node's
 * children on first expand and tables render a page of rows at a time.
 */
(() => {
  "use strict";

  const SCHEMA_VERSIONS = [1, 2];
  // torch/distributed/tensor/debug/_comm_mode.py's trivial_ops: reference dumps don't carry
  // the list that noise levels 1-2 leave out; ours do (commdebug.trivial_ops).
  const REFERENCE_TRIVIAL_OPS = [
    "aten.detach.default", "aten.t.default", "aten.view.default",
    "aten._to_copy.default", "aten.as_strided.default", "aten.transpose.int",
  ];
  const PHASES = ["forward", "backward", "checkpoint", "optimizer"];
  const PHASE_SHORT = {forward: "fwd", backward: "bwd", checkpoint: "ckpt", optimizer: "opt"};
  const OP_LISTS = {
    forward: "operations_forward", backward: "operations_backward",
    checkpoint: "operations_checkpointing", optimizer: "operations_optimizer",
  };
  const PAGE_ROWS = 200;

  // ---------------------------------------------------------------- helpers

  const $ = (id) => document.getElementById(id);
  const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
  const arr = (v) => (Array.isArray(v) ? v : []);
  const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : 0);
  const optNum = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);
  const str = (v) => (v == null ? "" : typeof v === "string" ? v : JSON.stringify(v));
  const sum = (values) => values.reduce((a, b) => a + (b || 0), 0);

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

  // Not toLocaleString: its first call loads locale data, a visible cost on the first draw.
  const fmtCount = (n) => (n == null ? "—" : String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ","));

  function fmtBytes(n) {
    if (n == null) return "—";
    if (n < 1024) return `${n} B`;
    const units = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    let v = n / 1024, i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return `${v.toFixed(v < 100 ? 1 : 0)} ${units[i]}`;
  }

  // "class 'torch.nn.modules.linear.Linear'" -> "Linear"
  const shortType = (t) => str(t).replace(/^class '(.*)'$/, "$1").split(".").pop();

  // ---------------------------------------------------------------- loading

  class DumpError extends Error {
    constructor(title, detail) { super(title); this.detail = detail; }
  }

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
          `This viewer reads schema versions ${SCHEMA_VERSIONS.join(" and ")}; ` +
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
    "start_s", "in_flight", "error", "unit",
  ];
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
        'Schema 2 events need "count", "strings" and "columns".');
    }
    const {columns, strings} = raw;
    const count = Number.isInteger(raw.count) ? raw.count : arr(columns.index).length;
    const groups = isObj(cd.groups) ? cd.groups : {};
    const cols = EVENT_FIELDS.map((name) => [name, Array.isArray(columns[name]) ? columns[name] : null,
      TEXT_FIELDS.has(name)]);
    const text = (i) => (Number.isInteger(i) && i >= 0 && i < strings.length ? str(strings[i]) : null);
    const events = new Array(count);
    for (let i = 0; i < count; i++) {
      const e = {};
      for (const [name, values, isText] of cols) {
        const v = values ? values[i] : undefined;
        e[name] = isText ? text(v) : v ?? null;
      }
      const g = e.group == null ? null : groups[e.group];
      e.group = {name: e.group, size: isObj(g) ? optNum(g.size) : null};
      e.in_flight = e.in_flight === true;
      events[i] = e;
    }
    return events;
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

  const fmtSeconds = (s) => (optNum(s) == null ? "—" : s < 1 ? `${(s * 1e3).toFixed(3)} ms` : `${s.toFixed(3)} s`);

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

  const predTitle = (pred) => `predicted on ${pred.cluster}: a model, not a measurement`;
  /** A predicted time, marked as one (class "pred", and the title says so). */
  const predCell = (pred, seconds) => h("span", {class: "pred", title: predTitle(pred),
    "data-pred": optNum(seconds) ?? ""}, fmtSeconds(optNum(seconds)));
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
      if (parent) parent.children.push(node);
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
      byFqn: new Map(nodes.map((n) => [n.fqn, n])),
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
    let counts, bytes = null;
    if (extra && isObj(extra.counts)) {
      counts = perPhase(extra.counts);
      if (isObj(extra.bytes)) bytes = perPhase(extra.bytes);
    } else {
      // Reference node: its backward includes checkpoint recompute, which it cannot separate.
      counts = {
        forward: sum(arr(raw.collectives_forward).map((p) => num(arr(p)[1]))),
        backward: sum(arr(raw.collectives_backward).map((p) => num(arr(p)[1]))),
        checkpoint: null, optimizer: null,
      };
    }
    return {
      idx, raw, fqn, parent, children: [],
      depth: parent ? parent.depth + 1 : 0,
      label: parent && fqn.startsWith(parent.fqn + ".") ? fqn.slice(parent.fqn.length + 1) : fqn,
      counts, bytes,
      totalCount: sum(Object.values(counts)),
      totalBytes: bytes && sum(Object.values(bytes)),
      opTotals: null,  // Map op -> calls, filled on first use by the op filter
    };
  }

  function perPhase(obj) {
    return Object.fromEntries(PHASES.map((p) => [p, num(obj[p])]));
  }

  /** The node's collectives (descendants included) as {op, phase, count, bytes, group}. */
  function collectivesOf(node, model) {
    const extra = node.raw.commdebug_node;
    if (isObj(extra) && Array.isArray(extra.collectives)) {
      return extra.collectives.filter(isObj).map((c) => ({
        op: str(c.op ?? c.key), phase: str(c.phase), count: num(c.count), bytes: optNum(c.bytes),
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
        ({op, count: num(v && v.count), bytes: optNum(v && v.bytes)}));
      return {count: num(s.collectives), bytes: optNum(s.bytes), byOp};
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

  // ---------------------------------------------------------------- tables

  /**
   * A table showing PAGE_ROWS rows at a time with a "show more" button; event lists reach
   * 100k rows. columns: {key, label, value(row), cell?(row) -> text|Node, cls?}. With
   * `sortable`, clicking a header sorts by value (nulls last), clicking again reverses.
   */
  function pagedTable(columns, rows, {id, sortable = false, empty = "None.", rowProps = null}) {
    if (rows.length === 0) return h("p", {id, class: "muted empty"}, empty);
    const tbody = h("tbody");
    const more = h("button", {type: "button", class: "more", onclick: () => fill()});
    const headers = columns.map((col) => h("th", {
      "data-key": col.key, class: col.cls, scope: "col",
      title: sortable ? "sort" : null, onclick: sortable ? () => sortBy(col) : null,
    }, col.label));
    const table = h("table", {id, class: "grid" + (sortable ? " sortable" : "")},
      h("thead", null, h("tr", null, ...headers)), tbody);
    let shown = 0, sorted = rows, sortKey = null, descending = false;

    function fill() {
      const end = Math.min(sorted.length, shown + PAGE_ROWS);
      const frag = document.createDocumentFragment();
      for (; shown < end; shown++) {
        const row = sorted[shown];
        frag.append(h("tr", rowProps && rowProps(row), ...columns.map((col) => {
          const text = str(col.value(row));
          // A clipped cell ends in an ellipsis: its title carries the full text.
          const cls = col.cellCls ? [col.cls, col.cellCls(row)].filter(Boolean).join(" ") : col.cls;
          return h("td", {class: cls || null, title: col.clip && text ? text : null}, col.cell ? col.cell(row) : text);
        })));
      }
      tbody.append(frag);
      const left = sorted.length - shown;
      more.hidden = left === 0;
      more.textContent = `Show ${fmtCount(Math.min(left, PAGE_ROWS))} more ` +
        `(${fmtCount(shown)} of ${fmtCount(sorted.length)} shown)`;
    }

    function sortBy(col) {
      descending = sortKey === col.key ? !descending : false;
      sortKey = col.key;
      const sign = descending ? -1 : 1;
      sorted = rows.map((row, i) => ({row, i, v: col.value(row)}))
        .sort((a, b) => {
          if (a.v == null || b.v == null) return (a.v == null) - (b.v == null) || a.i - b.i;
          const c = typeof a.v === "number" && typeof b.v === "number" ? a.v - b.v
            : String(a.v).localeCompare(String(b.v), "en", {numeric: true});
          return sign * c || a.i - b.i;
        })
        .map((x) => x.row);
      for (const th of headers) th.removeAttribute("aria-sort");
      headers[columns.indexOf(col)].setAttribute("aria-sort", descending ? "descending" : "ascending");
      tbody.replaceChildren();
      shown = 0;
      fill();
    }

    fill();
    return h("div", {class: "table-wrap"}, table, more);
  }

  // One line per DTensor argument, so shapes and placements line up across columns.
  const lines = (items) => h("span", {class: "lines"}, ...items.map((t) => h("code", null, t)));
  const phaseTag = (phase) => h("span", {class: "phase " + (PHASE_SHORT[phase] || "")}, phase);
  const opTag = (op) => h("span", {class: "op", "data-op": op}, op);
  const inFlightTag = () => h("span", {class: "badge in-flight", title: "not finished when the dump was written"}, "in flight");
  const failedTag = (error) => h("span", {class: "badge failed", title: str(error)}, "failed");

  // ---------------------------------------------------------------- tree

  class TreeView {
    constructor(model, ul, onSelect) {
      this.model = model;
      this.ul = ul;
      this.onSelect = onSelect;
      this.items = new Map();    // node -> its <li>, for nodes drawn so far
      this.expanded = this.firstLevel();
      this.filter = null;        // {matches, visible: Set of nodes} while filtering
      this.cursor = model.root;  // keyboard position
      this.selected = null;
      ul.onclick = (e) => this.onClick(e);
      ul.onkeydown = (e) => this.onKey(e);
    }

    /** Global and its chain of only children open: the first screen shows real modules. */
    firstLevel() {
      const open = new Set();
      for (let n = this.model.root; n; n = n.children.length === 1 ? n.children[0] : null) open.add(n);
      return open;
    }

    kids(node) {
      return this.filter ? node.children.filter((c) => this.filter.visible.has(c)) : node.children;
    }

    /** Redraw from scratch: drawn nodes are the expanded ones' (visible) children. */
    render() {
      this.items.clear();
      this.ul.replaceChildren();
      if (this.filter && !this.filter.visible.has(this.model.root)) {
        this.ul.append(h("li", {class: "muted empty", id: "no-match"}, "No module matches."));
        return;
      }
      this.ul.append(this.item(this.model.root));
      const open = [this.model.root];
      while (open.length) {  // iterative, as in buildModel
        const node = open.pop();
        if (this.expanded.has(node) && this.kids(node).length) {
          this.drawChildren(node);
          open.push(...this.kids(node));
        }
      }
      // Collapse all or a filter may have hidden the cursor: move it up to a drawn row.
      while (!this.items.has(this.cursor) && this.cursor.parent) this.cursor = this.cursor.parent;
      for (const node of [this.selected, this.cursor]) if (node) this.mark(node);
    }

    item(node) {
      const c = node.counts, kids = this.kids(node).length;
      const share = this.model.shareTotal > 0 ? this.model.shareOf(node) / this.model.shareTotal : 0;
      const bar = h("span", {class: "bar"});
      bar.style.setProperty("width", `${(share * 100).toFixed(2)}%`);
      const cell = (phase) => h("span", {
        class: `num ${PHASE_SHORT[phase]}${c[phase] === 0 ? " zero" : ""}`, "data-count": c[phase] ?? "",
      }, fmtCount(c[phase]));
      const bytesTitle = node.bytes ? PHASES.map((p) => `${p} ${fmtBytes(node.bytes[p])}`).join(", ")
        : node.totalBytes != null ? "bytes, all phases" : "bytes not recorded";
      const flags = this.model.flags && this.model.flags.get(node);
      const nameCell = h("span", {class: "name-cell"},
        h("span", {class: "caret", "aria-hidden": "true"}),
        h("span", {class: "name", title: node.fqn}, node.label),
        h("span", {class: "type", title: str(node.raw.module_type) || null}, shortType(node.raw.module_type)),
        flags ? h("span", {class: "flag", "data-findings": flags.length,
          title: flags.map((f) => `${str(f.kind)}: ${str(f.message)}`).join("\n")}, `⚠ ${flags.length}`) : null);
      nameCell.style.setProperty("--depth", String(node.depth));
      const flagged = this.model.flagged && this.model.flagged.has(node);
      const row = h("div", {class: "row cols" + (this.filter && this.filter.matches.has(node) ? " match" : "") +
        (flags ? " flagged" : flagged ? " has-flagged" : "")},
        nameCell, ...PHASES.map(cell),
        h("span", {class: "num bytes", "data-bytes": node.totalBytes ?? "", title: bytesTitle},
          fmtBytes(node.totalBytes)),
        this.model.pred ? h("span", {class: "num pred-cell"}, predCell(this.model.pred, predOf(this.model.pred, node))) : null,
        h("span", {class: "share", "data-share": share.toFixed(4),
          title: `${(share * 100).toFixed(1)}% of all ${this.model.shareUnit}`}, bar));
      const li = h("li", {
        role: "treeitem", id: `node-${node.idx}`, class: "node", "data-idx": node.idx,
        "data-fqn": node.fqn, "aria-level": node.depth + 1, "aria-selected": "false",
        "aria-expanded": kids ? String(this.expanded.has(node)) : null,
      }, row);
      this.items.set(node, li);
      return li;
    }

    drawChildren(node) {
      const group = h("ul", {role: "group"});
      for (const kid of this.kids(node)) group.append(this.item(kid));
      this.items.get(node).append(group);
      return group;
    }

    setExpanded(node, open) {
      const li = this.items.get(node);
      if (!li || !this.kids(node).length) return;
      if (open) this.expanded.add(node); else this.expanded.delete(node);
      li.setAttribute("aria-expanded", String(open));
      const group = li.querySelector(":scope > ul") || (open ? this.drawChildren(node) : null);
      if (group) group.hidden = !open;
      for (let n = this.cursor.parent; !open && n; n = n.parent) {
        if (n === node) this.moveCursor(node);  // the cursor was inside what just closed
      }
    }

    /** Expand everything, or collapse back to the first level. */
    setAll(open) {
      this.expanded = open ? new Set(this.model.nodes.filter((n) => n.children.length)) : this.firstLevel();
      this.render();
    }

    /** Show only filter.visible (matches and their ancestors), with the ancestors open. */
    setFilter(filter) {
      this.filter = filter;
      if (filter) {
        this.expanded = new Set(filter.visible);  // a match with no visible children draws as a leaf
      }
      this.render();
    }

    mark(node) {
      const li = this.items.get(node);
      if (!li) return;
      if (node === this.selected) li.setAttribute("aria-selected", "true");
      if (node === this.cursor) {
        li.classList.add("cursor");
        this.ul.setAttribute("aria-activedescendant", li.id);
      }
    }

    moveCursor(node) {
      const old = this.items.get(this.cursor);
      if (old) old.classList.remove("cursor");
      this.cursor = node;
      this.mark(node);
      const li = this.items.get(node);
      if (li) li.firstChild.scrollIntoView({block: "nearest"});
    }

    select(node) {
      const old = this.selected && this.items.get(this.selected);
      if (old) old.setAttribute("aria-selected", "false");
      this.selected = node;
      this.mark(node);
      this.moveCursor(node);
      this.onSelect(node);
    }

    /** Open the node's ancestors and select it (from an event row's module). */
    reveal(node) {
      for (let n = node.parent; n; n = n.parent) this.expanded.add(n);
      this.render();
      this.select(node);
    }

    next(node) {
      const kids = this.kids(node);
      if (this.expanded.has(node) && kids.length) return kids[0];
      for (let n = node; n.parent; n = n.parent) {
        const sibs = this.kids(n.parent), i = sibs.indexOf(n);
        if (i + 1 < sibs.length) return sibs[i + 1];
      }
      return node;
    }

    prev(node) {
      if (!node.parent) return node;
      const sibs = this.kids(node.parent), i = sibs.indexOf(node);
      if (i === 0) return node.parent;
      let n = sibs[i - 1];
      while (this.expanded.has(n) && this.kids(n).length) n = this.kids(n).at(-1);
      return n;
    }

    onClick(e) {
      const li = e.target.closest("li.node");
      if (!li) return;
      const node = this.model.nodes[Number(li.dataset.idx)];
      const onCaret = e.target.closest(".caret"), onName = e.target.closest(".name");
      if (onCaret || onName) this.setExpanded(node, !this.expanded.has(node));
      if (!onCaret) this.select(node);
      this.ul.focus({preventScroll: true});
    }

    onKey(e) {
      const node = this.cursor, open = this.expanded.has(node) && this.kids(node).length > 0;
      const actions = {
        ArrowDown: () => this.moveCursor(this.next(node)),
        ArrowUp: () => this.moveCursor(this.prev(node)),
        ArrowRight: () => (open ? this.moveCursor(this.kids(node)[0]) : this.setExpanded(node, true)),
        ArrowLeft: () => (open ? this.setExpanded(node, false) : node.parent && this.moveCursor(node.parent)),
        Enter: () => this.select(node),
        " ": () => this.select(node),
        Home: () => this.moveCursor(this.model.root),
      };
      if (!actions[e.key]) return;
      e.preventDefault();
      actions[e.key]();
    }
  }

  // ---------------------------------------------------------------- the viewer

  /** The page for one loaded dump; the static controls call into the current one. */
  class Viewer {
    constructor(dump, predicted) {
      const model = this.model = buildModel(dump, predicted);
      showMode(false);
      showPredicted(model.pred);
      this.noise = model.noiseLevel ?? 3;
      this.renderSummary();
      this.tree = new TreeView(model, $("tree"), (node) => this.renderDetail(node));
      this.resetFilters();
      this.tree.render();
      this.tree.select(model.root);
      this.renderEvents();
      $("share-head").title = `share of all ${model.shareUnit} (Global = 100%)`;
      for (const radio of document.querySelectorAll('input[name="noise"]')) {
        radio.checked = Number(radio.value) === this.noise;
      }
    }

    renderSummary() {
      const {model} = this, cd = model.cd;
      const meta = cd && isObj(cd.metadata) ? cd.metadata : {};
      const totals = runTotals(model);
      const fact = (id, label, value) =>
        h("div", {class: "fact"}, h("span", {class: "label"}, label), h("span", {id, class: "value"}, value));
      const show = (v) => (v == null || v === "" ? "—" : str(v));
      const facts = model.reference
        ? [fact("format", "format", "reference CommDebugMode dump")]
        : [
          fact("meta-rank", "rank", show(meta.rank)),
          fact("meta-world-size", "world size", show(meta.world_size)),
          fact("meta-host", "host", show(meta.hostname)),
          fact("meta-backend", "backend", show(meta.backend)),
          fact("meta-torch", "torch", show(meta.torch_version)),
          fact("meta-steps", "steps", show(meta.steps)),
          fact("meta-noise", "noise level", show(cd.noise_level)),
        ];
      facts.push(
        fact("total-collectives", "collectives", fmtCount(totals.count)),
        fact("total-bytes", "bytes", totals.bytes == null ? "not recorded" : fmtBytes(totals.bytes)));
      const {pred} = model;
      if (pred) {
        facts.push(fact("total-pred", `predicted on ${pred.cluster}`, predCell(pred, pred.total)));
      }
      const byOp = h("ul", {id: "by-op", class: "chips", "aria-label": "collectives by op"},
        ...totals.byOp.sort((a, b) => (b.bytes ?? b.count) - (a.bytes ?? a.count)).map((e) =>
          h("li", {"data-op": e.op, "data-count": e.count, "data-bytes": e.bytes ?? ""},
            opTag(e.op), h("span", {class: "count"}, `×${fmtCount(e.count)}`),
            e.bytes == null ? null : h("span", {class: "muted"}, fmtBytes(e.bytes)))));
      const notes = [];
      if (model.reference) {
        notes.push("Written by PyTorch's CommDebugMode: no bytes, groups or events; " +
          "backward counts include activation-checkpoint recompute.");
      }
      if (cd && num(cd.events_dropped) > 0) {
        notes.push(`${fmtCount(num(cd.events_dropped))} events were dropped ` +
          `(max_events ${fmtCount(optNum(cd.max_events))}); counts and bytes still cover them.`);
      }
      if (pred) {
        notes.push(`"pred" figures are predicted on ${pred.cluster} from the bytes and groups recorded ` +
          "(a model, not a measurement; calls added up as if serial).", ...pred.notes.map((n) => `prediction: ${n}`));
      }
      $("summary").replaceChildren(h("div", {class: "facts"}, ...facts), byOp,
        ...notes.map((n) => h("p", {class: "note"}, n)));
    }

    resetFilters() {
      $("search").value = "";
      const ops = [...opTotals(this.model.root).keys()].sort();
      $("op-filter").replaceChildren(h("option", {value: ""}, "any collective"),
        ...ops.map((op) => h("option", {value: op}, `issues ${op}`)));
      $("match-count").textContent = "";
      $("op-filter").title = "";
    }

    applyFilters() {
      const query = $("search").value.trim().toLowerCase(), op = $("op-filter").value;
      if (!query && !op) {
        this.tree.setFilter(null);
        $("match-count").textContent = "";
        return;
      }
      const matches = new Set(), visible = new Set();
      for (const node of this.model.nodes) {
        if (query && !node.fqn.toLowerCase().includes(query)) continue;
        if (op && directCalls(node, op) <= 0) continue;
        matches.add(node);
        for (let n = node; n && !visible.has(n); n = n.parent) visible.add(n);
      }
      $("match-count").textContent = `${fmtCount(matches.size)} match${matches.size === 1 ? "" : "es"}`;
      this.tree.setFilter({matches, visible});
    }

    renderDetail(node) {
      this.node = node;
      const {pred} = this.model;
      const predHead = () => h("th", {class: "num pred", title: predTitle(pred)}, "pred");
      const phases = h("div", {class: "table-wrap"}, h("table", {id: "detail-phases", class: "grid compact"},
        h("thead", null, h("tr", null, ...["", "calls", "bytes"].map((t) => h("th", {class: t && "num"}, t)),
          pred ? predHead() : null)),
        h("tbody", null, ...PHASES.map((p) => h("tr", {"data-phase": p}, h("td", null, phaseTag(p)),
          h("td", {class: "num"}, fmtCount(node.counts[p])),
          h("td", {class: "num"}, node.bytes ? fmtBytes(node.bytes[p]) : "—"),
          pred ? h("td", {class: "num"}, predCell(pred, predOf(pred, node, p))) : null)))));
      const lines = pred && isObj(pred.lines[node.fqn]) ? pred.lines[node.fqn] : {};
      const collectiveColumns = [
        {key: "phase", label: "phase", value: (c) => c.phase, cell: (c) => phaseTag(c.phase)},
        {key: "op", label: "op", value: (c) => c.op, cell: (c) => opTag(c.op)},
        {key: "count", label: "calls", value: (c) => c.count, cell: (c) => fmtCount(c.count), cls: "num"},
        {key: "bytes", label: "bytes", value: (c) => c.bytes, cell: (c) => fmtBytes(c.bytes), cls: "num"},
        {key: "group", label: "group", value: (c) => c.group, cell: (c) => c.group ?? "—"},
      ];
      if (pred) {
        collectiveColumns.push({key: "pred", label: "pred", cls: "num", value: (c) => optNum(lines[c.line]),
          cell: (c) => predCell(pred, lines[c.line])});
      }
      const collectives = pagedTable(collectiveColumns, collectivesOf(node, this.model),
        {id: "detail-collectives", empty: "No collectives."});
      const params = pagedTable([
        {key: "name", label: "parameter", value: (p) => p[0]},
        {key: "placements", label: "placements", value: (p) => p[1], cell: (p) => h("code", null, p[1])},
      ], arr(node.raw.parameters).filter(Array.isArray).map((p) => [str(p[0]), str(p[1])]),
      {id: "detail-params", empty: "No DTensor parameters."});
      $("detail-body").replaceChildren(
        h("h2", {id: "detail-fqn"}, node.fqn),
        h("p", {id: "detail-type", class: "muted"}, str(node.raw.module_type) ||
          (node.parent ? "module type not recorded" : "pseudo-module: the whole run")),
        phases,
        h("h3", null, "Collectives ", h("span", {class: "muted"}, "descendants included")), collectives,
        h("h3", null, "Parameters"), params);
      this.renderOps();
    }

    renderOps() {
      const {model, node, noise} = this;
      const written = model.noiseLevel;
      $("noise-note").textContent = noise === 0 ? "Noise level 0 shows no operations."
        : written != null && noise > written
          ? `This dump was written at noise level ${written}; higher levels show nothing more.`
          : "Operations issued in this module itself, identical rows merged.";
      $("ops-table").replaceChildren(pagedTable([
        {key: "phase", label: "phase", value: (r) => r.phase, cell: (r) => phaseTag(r.phase)},
        {key: "name", label: "op", value: (r) => r.name, cell: (r) => h("code", null, r.name), cls: "nowrap"},
        {key: "count", label: "count", value: (r) => r.count, cell: (r) => fmtCount(r.count), cls: "num"},
        {key: "shapes", label: "input shapes", value: (r) => r.shapes.join(", "), cls: "nowrap",
          cell: (r) => lines(r.shapes.map((t) => t.replace(/^torch\.Size\((.*)\)$/, "$1")))},
        {key: "sharding", label: "input sharding", value: (r) => r.sharding.join(", "), cls: "nowrap",
          cell: (r) => lines(r.sharding)},
        {key: "mesh", label: "device mesh", value: (r) => r.mesh, cell: (r) => h("code", null, r.mesh), cls: "nowrap"},
      ], opRows(model, node, noise), {id: "detail-ops", sortable: true, empty: "No operations at this level."}));
    }

    setNoise(level) {
      this.noise = level;
      this.renderOps();
    }

    renderEvents() {
      const events = this.model.events;
      $("events").hidden = events === null;
      $("event-detail").hidden = true;
      if (events === null) return;
      const {byFqn} = this.model;
      const moduleCell = (e) => {
        const node = byFqn.get(e.module);
        return node ? h("a", {href: "#", class: "module-link", onclick: (ev) => {
          ev.preventDefault();
          ev.stopPropagation();
          this.showModule(node);
        }}, str(e.module)) : str(e.module);
      };
      const columns = [
        {key: "index", label: "#", value: (e) => optNum(e.index), cls: "num"},
        {key: "step", label: "step", value: (e) => optNum(e.step), cls: "num"},
        {key: "phase", label: "phase", value: (e) => e.phase, cell: (e) => phaseTag(str(e.phase))},
        {key: "op", label: "op", value: (e) => e.op, cell: (e) => opTag(str(e.op))},
        {key: "bytes", label: "bytes", value: (e) => optNum(e.size_bytes), cell: (e) => fmtBytes(optNum(e.size_bytes)), cls: "num"},
        {key: "group", label: "group", value: (e) => e.group.name,
          cell: (e) => groupLabel(this.model, e.group.name, e.group.size)},
        {key: "module", label: "module", value: (e) => e.module, cell: moduleCell, cls: "clip", clip: true},
        {key: "source", label: "source", value: (e) => e.source, cell: (e) => h("code", null, str(e.source)),
          cls: "clip", clip: true},
        {key: "latency", label: "latency", value: (e) => optNum(e.latency_s), cls: "num",
          cell: (e) => fmtSeconds(e.latency_s)},
      ];
      const {pred} = this.model;
      if (pred && pred.events) {
        columns.push({key: "pred", label: "pred", value: (e) => e.predicted_s, cls: "num",
          cell: (e) => predCell(pred, e.predicted_s)});
      }
      // Fields most runs leave empty get a column only when some call has them.
      const any = (field) => events.some((e) => e[field] != null && e[field] !== false);
      if (any("microbatch")) {
        columns.push({key: "microbatch", label: "mb", value: (e) => optNum(e.microbatch), cls: "num"});
      }
      if (any("unit")) {  // FSDP2: whose parameters a gather carries (prefetches serve the next module)
        columns.push({key: "unit", label: "unit", value: (e) => e.unit, cls: "clip", clip: true,
          cell: (e) => (e.unit == null || e.unit === e.module ? str(e.unit) : h("strong", {title: "another module's parameters"}, str(e.unit)))});
      }
      if (any("peer")) {
        columns.push({key: "peer", label: "peer", value: (e) => optNum(e.peer), cls: "num",
          cell: (e) => (e.peer == null ? "" : `${e.op === "recv" ? "from" : "to"} ${e.peer}` +
            (e.p2p_seq == null ? "" : ` #${e.p2p_seq}`))});
      }
      const inFlight = events.filter((e) => e.in_flight).length;
      const failed = events.filter((e) => e.error != null).length;
      if (inFlight || failed) {
        const state = (e) => (e.error != null ? "failed" : e.in_flight ? "in flight" : null);
        columns.push({key: "state", label: "state", value: state,
          cell: (e) => h("span", null, e.in_flight ? inFlightTag() : "", e.error != null ? failedTag(e.error) : "")});
      }
      $("events-count").textContent = `${fmtCount(events.length)} recorded` +
        (inFlight ? `, ${fmtCount(inFlight)} in flight` : "") + (failed ? `, ${fmtCount(failed)} failed` : "");
      $("events-table").replaceChildren(pagedTable(columns, events, {
        id: "events-grid", sortable: true, empty: "No collective calls recorded.",
        rowProps: (e) => ({
          class: e.in_flight ? "in-flight" : null, "data-index": optNum(e.index) ?? "",
          title: "show this call's details",
          onclick: (ev) => { if (!ev.target.closest("a")) this.renderEvent(e, ev.currentTarget); },
        }),
      }));
    }

    /** Every field of one call, below the list. */
    renderEvent(e, tr) {
      for (const old of document.querySelectorAll("#events-grid tr.chosen")) old.classList.remove("chosen");
      if (tr) tr.classList.add("chosen");
      const g = this.model.cd && isObj(this.model.cd.groups) ? this.model.cd.groups[str(e.group.name)] : null;
      const ranks = isObj(g) && Array.isArray(g.ranks) ? g.ranks : null;
      const timed = optNum(e.latency_s) != null && e.latency_s > 0;
      const algbw = timed && optNum(e.size_bytes) != null ? e.size_bytes / e.latency_s / 1e9 : null;
      const rows = [
        ["index", fmtCount(optNum(e.index))],
        ["state", e.in_flight || e.error != null ? h("span", null, e.in_flight ? inFlightTag() : "",
          e.error != null ? failedTag(e.error) : "") : "finished"],
        ["error", e.error == null ? "—" : h("code", null, str(e.error))],
        ["step", str(e.step)],
        ["microbatch", e.microbatch == null ? "—" : str(e.microbatch)],
        ["phase", phaseTag(str(e.phase))],
        ["op", opTag(str(e.op))],
        ["key", h("code", null, str(e.key))],
        ["aten op", h("code", null, str(e.aten_op))],
        ["module", str(e.module)],
        ["FSDP unit", e.unit == null ? "—" : str(e.unit)],
        ["group", `${groupLabel(this.model, e.group.name, e.group.size)} (name ${str(e.group.name)}` +
          (ranks ? `, ranks ${ranks.map(str).join(",")})` : ")")],
        ["seq", e.seq == null ? "— (point-to-point)" : str(e.seq)],
        ["peer", e.peer == null ? "—" : `${e.op === "recv" ? "from" : "to"} rank ${str(e.peer)}`],
        ["p2p seq", e.p2p_seq == null ? "—" : str(e.p2p_seq)],
        ["dtype", str(e.dtype) || "—"],
        ["input shapes", h("code", null, fmtShapes(e.input_shapes))],
        ["output shapes", h("code", null, fmtShapes(e.output_shapes))],
        ["input bytes", fmtBytes(optNum(e.input_bytes))],
        ["output bytes", fmtBytes(optNum(e.output_bytes))],
        ["message size", fmtBytes(optNum(e.size_bytes))],
        ["DTensor op", h("code", null, str(e.dtensor_op) || "—")],
        ["placements", h("code", null, str(e.placements) || "—")],
        ["mesh", h("code", null, str(e.mesh) || "—")],
        ["source", h("code", null, str(e.source) || "—")],
        ["start", e.start_s == null ? "—" : `${fmtSeconds(e.start_s)} after the start`],
        ["latency", timed ? fmtSeconds(e.latency_s) : "not timed"],
        ...(this.model.pred && this.model.pred.events ? [["predicted", e.predicted_s == null ? "not predicted"
          : h("span", null, predCell(this.model.pred, e.predicted_s), ` on ${this.model.pred.cluster} (a model, not a measurement)`)]] : []),
        ["bandwidth", algbw == null ? "—" :
          `algbw ${algbw.toFixed(2)} GB/s, busbw ${(algbw * num(e.busbw_factor)).toFixed(2)} GB/s`],
      ];
      const box = $("event-detail");
      box.replaceChildren(h("h3", null, `Call #${str(e.index)}`),
        h("div", {class: "table-wrap"}, h("table", {id: "event-fields", class: "grid compact kv"},
          h("tbody", null, ...rows.map(([k, v]) => h("tr", {"data-field": k}, h("th", {scope: "row"}, k), h("td", null, v)))))));
      box.hidden = false;
      box.classList.toggle("in-flight", e.in_flight);
    }

    showModule(node) {
      if (this.tree.filter && !this.tree.filter.visible.has(node)) {
        $("search").value = "";
        $("op-filter").value = "";
        this.applyFilters();
      }
      this.tree.reveal(node);
      $("tree").focus({preventScroll: true});
    }
  }

  // ---------------------------------------------------------------- a folder of ranks

  /** The tree's pred column and its header, for a model with predictions (else hidden). */
  function showPredicted(pred) {
    $("tree-pane").classList.toggle("with-pred", !!pred);
    // made only when needed, so a page without a cluster has the same header as before
    const old = $("pred-head");
    if (old) old.remove();
    if (pred) {
      $("share-head").before(h("span", {id: "pred-head", class: "num pred",
        title: `${predTitle(pred)} (all phases, descendants included)`}, "pred"));
    }
  }

  /** Show the single-dump parts of the page, or the folder page's. */
  function showMode(ranks) {
    $("rank-picker").hidden = !ranks;
    $("findings").hidden = !ranks;
    $("op-filter").hidden = ranks;
    $("ops-section").hidden = ranks;
    if (ranks) $("events").hidden = true;
  }

  /**
   * The folder page's model: the union of the ranks' module trees (visualizer.ranks_data), with
   * the numbers of one rank at a time on the nodes so the tree view draws it like one dump.
   * Each rank's numbers are a separate JSON block, parsed when first needed.
   */
  function buildRanksModel(index) {
    const mods = isObj(index.modules) ? index.modules : {};
    const fqns = arr(mods.fqn), parents = arr(mods.parent), typeIds = arr(mods.type), types = arr(mods.types);
    if (fqns.length === 0) throw new DumpError("This folder page has no modules.", "Write it again with commdebug.");
    const nodes = [];
    for (let i = 0; i < fqns.length; i++) {
      const fqn = str(fqns[i]), p = parents[i];
      // Parents come before their children; anything else hangs under the root.
      const parent = i === 0 ? null : Number.isInteger(p) && p >= 0 && p < i ? nodes[p] : nodes[0];
      const node = {
        idx: i, fqn, parent, children: [], raw: {fqn, module_type: str(types[typeIds[i]])},
        depth: parent ? parent.depth + 1 : 0,
        label: parent && fqn.startsWith(parent.fqn + ".") ? fqn.slice(parent.fqn.length + 1) : fqn,
        counts: {}, bytes: null, totalCount: 0, totalBytes: null, opTotals: new Map(),
      };
      nodes.push(node);
      if (parent) parent.children.push(node);
    }
    const model = {
      cd: null, nodes, root: nodes[0], reference: false, events: null,
      byFqn: new Map(nodes.map((n) => [n.fqn, n])),
      shareOf: (n) => n.totalBytes ?? n.totalCount, shareTotal: 0, shareUnit: "bytes",
      flags: new Map(), flagged: new Set(),
    };
    // Findings on the modules they name; their ancestors are marked too, to find them collapsed.
    const check = isObj(index.check) ? index.check : {};
    for (const f of arr(check.findings).filter(isObj)) {
      const named = new Set(arr(f.sides).filter(isObj).map((side) => model.byFqn.get(side.module)).filter(Boolean));
      for (const node of named) {
        if (!model.flags.has(node)) model.flags.set(node, []);
        model.flags.get(node).push(f);
        for (let n = node.parent; n; n = n.parent) model.flagged.add(n);
      }
    }
    return model;
  }

  /** Lower median, min and max of the known values: the cells to mark. */
  function spread(values) {
    const known = values.filter((v) => v != null).sort((a, b) => a - b);
    if (known.length === 0) return null;
    return {min: known[0], median: known[Math.floor((known.length - 1) / 2)], max: known.at(-1)};
  }

  class RanksViewer {
    constructor(index) {
      this.index = index;
      this.ranks = arr(index.ranks).filter(isObj);
      this.withTree = this.ranks.filter((r) => r.tree && isObj(r.blocks));
      if (this.withTree.length === 0) throw new DumpError("No rank in this folder has a module tree.", "");
      this.cache = new Map();
      this.check = isObj(index.check) ? index.check : {findings: []};
      this.model = buildRanksModel(index);
      this.noise = 0;
      showMode(true);
      showPredicted(null);
      const select = $("rank-select");
      select.replaceChildren(...this.withTree.map((r, i) => h("option", {value: i}, `${str(r.rank)}`)));
      select.onchange = () => this.setRank(this.withTree[Number(select.value)]);
      this.useRank(this.withTree[0]);
      this.renderSummary();
      this.renderFindings();
      this.tree = new TreeView(this.model, $("tree"), (node) => this.renderDetail(node));
      this.resetFilters();
      this.tree.render();
      this.tree.select(this.model.root);
      $("share-head").title = "share of this rank's bytes (Global = 100%)";
    }

    /** A block of numbers (one rank's counts, bytes or times), parsed once. */
    block(id) {
      if (id == null) return null;
      if (!this.cache.has(id)) {
        const el = $(`block-${Number(id)}`);
        let values = null;
        try { values = el ? JSON.parse(el.textContent) : null; } catch (e) { values = null; }
        this.cache.set(id, Array.isArray(values) ? values : null);
      }
      return this.cache.get(id);
    }

    /** The rank's numbers for node `i`: {calls, counts per phase, bytes, seconds}. */
    numbers(rank, i) {
      const counts = this.block(rank.blocks.counts), bytes = this.block(rank.blocks.bytes);
      const secs = this.block(rank.blocks.time);
      const per = counts && counts[4 * i] != null
        ? Object.fromEntries(PHASES.map((p, k) => [p, optNum(counts[4 * i + k])])) : null;
      return {
        counts: per, calls: per ? sum(Object.values(per)) : null,
        bytes: bytes ? optNum(bytes[i]) : null, seconds: secs ? optNum(secs[i]) : null,
      };
    }

    /** Put `rank`'s numbers on the tree's nodes. */
    useRank(rank) {
      this.rank = rank;
      for (const node of this.model.nodes) {
        const n = this.numbers(rank, node.idx);
        node.counts = n.counts || Object.fromEntries(PHASES.map((p) => [p, null]));
        node.totalCount = n.calls ?? 0;
        node.totalBytes = n.bytes;
      }
      const root = this.model.root;
      this.model.shareOf = root.totalBytes ? (n) => n.totalBytes ?? 0 : (n) => n.totalCount;
      this.model.shareTotal = root.totalBytes ? root.totalBytes : root.totalCount;
      this.model.shareUnit = root.totalBytes ? "bytes" : "calls";
      $("rank-select").value = String(this.withTree.indexOf(rank));
    }

    setRank(rank) {
      this.useRank(rank);
      this.renderSummary();
      this.tree.render();
      if (this.tree.selected) this.renderDetail(this.tree.selected);
    }

    renderSummary() {
      const {index, check, rank} = this;
      const perRank = (c) => {
        const span = isObj(c.collectives_per_rank) ? c.collectives_per_rank : {};
        const lo = optNum(span.min), hi = optNum(span.max);
        return lo == null || hi == null ? "—" : lo === hi ? fmtCount(lo) : `${fmtCount(lo)}–${fmtCount(hi)}`;
      };
      const meta = isObj(rank.meta) ? rank.meta : {};
      const fact = (id, label, value) =>
        h("div", {class: "fact"}, h("span", {class: "label"}, label), h("span", {id, class: "value"}, value));
      const findings = arr(check.findings);
      const facts = [
        fact("ranks-count", "ranks", fmtCount(this.ranks.length)),
        fact("meta-world-size", "world size", str(meta.world_size ?? "—")),
        fact("check-groups", "groups", fmtCount(optNum(check.groups))),
        // per rank, not summed over ranks: "24", or "24–25" when ranks differ
        fact("check-collectives", "collectives per rank", perRank(check)),
        fact("check-status", "check", findings.length ? `${fmtCount(findings.length)} finding${findings.length === 1 ? "" : "s"}` : "consistent"),
        fact("meta-rank", "showing rank", str(rank.rank)),
        fact("meta-host", "host", str(meta.hostname ?? "—")),
        fact("meta-ended", "ended by", meta.ended_by == null ? "not recorded" : str(meta.ended_by)),
        fact("total-collectives", "collectives", fmtCount(optNum(rank.collectives))),
        fact("total-bytes", "bytes", rank.bytes == null ? "not recorded" : fmtBytes(rank.bytes)),
        fact("total-time", "time", rank.seconds == null ? "not timed" : fmtSeconds(rank.seconds)),
      ];
      const notes = [
        ...arr(rank.notes).map(str),
        ...this.ranks.filter((r) => !r.tree).map((r) => `rank ${str(r.rank)} (${str(r.file)}): ${str(r.format)} dump, no module tree`),
        ...arr(index.errors).map((e) => `not read: ${str(e)}`),
      ];
      $("source").textContent = `— ${str(index.folder)}`;
      $("summary").replaceChildren(h("div", {class: "facts"}, ...facts),
        ...notes.map((n) => h("p", {class: "note"}, n)));
      $("summary").classList.toggle("inconsistent", findings.length > 0);
    }

    renderFindings() {
      const findings = arr(this.check.findings).filter(isObj);
      const sideText = (side) => {
        const what = side.op == null ? "nothing" : `${str(side.op)} ${fmtBytes(optNum(side.size_bytes) ?? 0)}` +
          (side.dtype ? ` ${str(side.dtype)}` : "") + (side.in_flight ? " (unfinished)" : "");
        const node = side.module ? this.model.byFqn.get(side.module) : null;
        return h("li", {class: "side"}, `ranks ${arr(side.ranks).map(str).join(",")}: ${what}`,
          side.module ? " in " : null,
          node ? h("a", {href: "#", class: "module-link", onclick: (ev) => { ev.preventDefault(); this.showModule(node); }},
            str(side.module)) : side.module ? h("code", null, str(side.module)) : null,
          side.source ? " at " : null, side.source ? h("code", null, str(side.source)) : null);
      };
      const head = h("h2", null, "Check ", h("span", {class: "muted"},
        findings.length ? `${fmtCount(findings.length)} finding${findings.length === 1 ? "" : "s"}`
          : "all ranks issued the same collectives"));
      const list = h("ol", {id: "findings-list"}, ...findings.map((f) =>
        h("li", {class: "finding", "data-kind": str(f.kind), "data-group": str(f.group), "data-seq": f.seq ?? ""},
          h("span", {class: "badge kind"}, str(f.kind)), " ", h("span", {class: "message"}, str(f.message)),
          h("ul", {class: "sides"}, ...arr(f.sides).filter(isObj).map(sideText)))));
      const notes = arr(this.check.notes).map((n) => h("p", {class: "note"}, str(n)));
      $("findings").replaceChildren(head, findings.length ? list : h("p", {class: "muted empty"}, "No findings."), ...notes);
    }

    resetFilters() {
      $("search").value = "";
      $("op-filter").value = "";
      $("match-count").textContent = "";
    }

    applyFilters() { Viewer.prototype.applyFilters.call(this); }

    setNoise() {}

    showModule(node) { Viewer.prototype.showModule.call(this, node); }

    renderDetail(node) {
      this.node = node;
      const rows = this.withTree.map((r) => ({rank: r, ...this.numbers(r, node.idx)}));
      const stats = {calls: spread(rows.map((r) => r.calls)), bytes: spread(rows.map((r) => r.bytes)),
        seconds: spread(rows.map((r) => r.seconds))};
      const timed = rows.some((r) => r.seconds != null);
      const mark = (key) => (row) => {
        const st = stats[key], v = row[key];
        if (!st || v == null || st.min === st.max) return null;
        return [v === st.min && "min", v === st.median && "median", v === st.max && "max"].filter(Boolean).join(" ") || null;
      };
      const columns = [
        {key: "rank", label: "rank", value: (r) => optNum(r.rank.rank), cls: "num"},
        ...PHASES.map((p) => ({key: p, label: PHASE_SHORT[p], cls: `num ${PHASE_SHORT[p]}`,
          value: (r) => (r.counts ? r.counts[p] : null), cell: (r) => fmtCount(r.counts ? r.counts[p] : null)})),
        {key: "calls", label: "calls", value: (r) => r.calls, cell: (r) => fmtCount(r.calls), cls: "num", cellCls: mark("calls")},
        {key: "bytes", label: "bytes", value: (r) => r.bytes, cell: (r) => fmtBytes(r.bytes), cls: "num", cellCls: mark("bytes")},
      ];
      if (timed) {
        columns.push({key: "time", label: "time", value: (r) => r.seconds, cell: (r) => fmtSeconds(r.seconds),
          cls: "num", cellCls: mark("seconds")});
      }
      const fmt = {calls: fmtCount, bytes: fmtBytes, seconds: fmtSeconds};
      const ranksAt = (key, v) => rows.filter((r) => r[key] === v).map((r) => str(r.rank.rank)).join(",");
      const statRows = Object.entries(stats).filter(([key, st]) => st && (key !== "seconds" || timed)).map(([key, st]) =>
        h("tr", {"data-stat": key}, h("th", {scope: "row"}, key === "seconds" ? "time" : key),
          ...["min", "median", "max"].map((m) => h("td", {class: `num ${st.min === st.max ? "" : m}`,
            title: `rank ${ranksAt(key, st[m])}`}, fmt[key](st[m]))),
          h("td", {class: "muted"}, st.min === st.max ? "same on every rank" : `max rank ${ranksAt(key, st.max)}`)));
      const flags = this.model.flags.get(node) || [];
      $("detail-body").replaceChildren(
        h("h2", {id: "detail-fqn"}, node.fqn),
        h("p", {id: "detail-type", class: "muted"}, str(node.raw.module_type) ||
          (node.parent ? "module type not recorded" : "pseudo-module: the whole run")),
        // replaceChildren, unlike h(), writes a null child as the text "null": spread nothing instead
        ...(flags.length ? [h("ul", {id: "detail-findings", class: "flags"}, ...flags.map((f) =>
          h("li", {"data-kind": str(f.kind)}, h("span", {class: "badge kind"}, str(f.kind)), " ", str(f.message))))] : []),
        h("h3", null, "Across ranks ", h("span", {class: "muted"}, "descendants included; min, median and max marked")),
        h("div", {class: "table-wrap"}, h("table", {id: "rank-stats", class: "grid compact"},
          h("thead", null, h("tr", null, ...["", "min", "median", "max", ""].map((t) => h("th", {class: t && "num"}, t)))),
          h("tbody", null, ...statRows))),
        h("h3", null, "Per rank ", h("span", {class: "muted"}, "click a rank to show its numbers in the tree")),
        pagedTable(columns, rows, {id: "rank-table", sortable: true, empty: "No ranks.", rowProps: (r) => ({
          class: r.rank === this.rank ? "current" : null, "data-rank": str(r.rank.rank),
          onclick: () => { if (r.rank !== this.rank) this.setRank(r.rank); },
        })}));
    }
  }

  // ---------------------------------------------------------------- page state

  let viewer = null;

  function showError(err) {
    const box = $("error");
    box.replaceChildren(h("strong", null, err instanceof DumpError ? err.message : "Could not show this dump."),
      " ", str(err instanceof DumpError ? err.detail : String(err)));
    box.hidden = false;
    document.body.dataset.state = "error";
    $("dropzone").hidden = viewer !== null;
  }

  function load(text, source, predicted = null) {
    let next;
    try {
      const dump = parseDump(text);
      performance.mark("commdebug:parsed");
      next = new Viewer(dump, predicted);
    } catch (err) {
      if (!(err instanceof DumpError)) console.warn(err);  // a bug in us or a very odd file
      showError(err);
      return false;
    }
    viewer = next;
    $("error").hidden = true;
    $("dropzone").hidden = true;
    $("viewer").hidden = false;
    $("source").textContent = source ? `— ${source}` : "";
    document.body.dataset.state = "ready";
    return true;
  }

  function openFile(file) {
    if (!file) {
      showError(new DumpError("Nothing to open.", "Drop or pick one .json file."));
      return;
    }
    file.text().then((text) => load(text, file.name),
      (err) => showError(new DumpError(`Could not read ${file.name}.`, String(err))));
  }

  function wireControls() {
    let pending = 0;
    $("search").addEventListener("input", () => {
      clearTimeout(pending);  // filtering walks every module: wait for a pause in typing
      pending = setTimeout(() => viewer && viewer.applyFilters(), 120);
    });
    $("op-filter").addEventListener("change", (e) => {
      const select = e.target;  // narrow: the chosen op may be cut, the title shows it whole
      select.title = select.value ? select.options[select.selectedIndex].textContent : "";
      if (viewer) viewer.applyFilters();
    });
    $("expand-all").addEventListener("click", () => viewer && viewer.tree.setAll(true));
    $("collapse-all").addEventListener("click", () => viewer && viewer.tree.setAll(false));
    for (const radio of document.querySelectorAll('input[name="noise"]')) {
      radio.addEventListener("change", () => viewer && viewer.setNoise(Number(radio.value)));
    }
    $("file-input").addEventListener("change", (e) => {
      openFile(e.target.files[0]);
      e.target.value = "";  // picking the same file again must fire change again
    });
    document.addEventListener("dragover", (e) => {
      e.preventDefault();
      document.body.classList.add("dragging");
    });
    document.addEventListener("dragleave", (e) => {
      if (!e.relatedTarget) document.body.classList.remove("dragging");
    });
    document.addEventListener("drop", (e) => {
      e.preventDefault();
      document.body.classList.remove("dragging");
      openFile(e.dataTransfer && e.dataTransfer.files[0]);
    });
  }

  /** The folder page: its index of modules, ranks and findings (visualizer.write_ranks_html). */
  function loadRanks(text) {
    try {
      let index;
      try { index = JSON.parse(text); } catch (e) { throw new DumpError("The folder page's data is not valid JSON.", e.message); }
      if (!isObj(index) || index.format !== "commdebug-ranks") {
        throw new DumpError("This page's data is not a folder of ranks.", "Write it again with commdebug view FOLDER.");
      }
      performance.mark("commdebug:parsed");
      viewer = new RanksViewer(index);
    } catch (err) {
      if (!(err instanceof DumpError)) console.warn(err);
      showError(err);
      return false;
    }
    $("error").hidden = true;
    $("dropzone").hidden = true;
    $("viewer").hidden = false;
    document.body.dataset.state = "ready";
    return true;
  }

  /** The embedded predictions (the "predicted" JSON block), or null if absent or bad. */
  function parsePredicted(el) {
    if (!el) return null;
    try { return JSON.parse(el.textContent); } catch (e) { console.warn("predictions not shown:", e); return null; }
  }

  /** Stamp the first frame painted after the tree went in: ms since navigation start. */
  function stampReady() {
    window.__commdebugReady = performance.now();
    requestAnimationFrame(() => setTimeout(() => { window.__commdebugPainted = performance.now(); }, 0));
  }

  wireControls();
  const embedded = $("dump"), ranksData = $("ranks"), predictedData = $("predicted");
  if (ranksData) {
    if (loadRanks(ranksData.textContent)) stampReady();
  } else if (!embedded) {
    document.body.dataset.state = "empty";
    $("dropzone").hidden = false;
  } else if (load(embedded.textContent, null, parsePredicted(predictedData))) {
    // Benchmarks and tests read these: ms from navigation start to the first level in the DOM,
    // and to the frame that shows it.
    stampReady();
  }
})();
