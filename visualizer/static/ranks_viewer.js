/* The page for a folder of per-rank dumps (visualizer.write_ranks_html): the ranks' module tree
 * once, one rank's numbers on it at a time, every rank's numbers for the selected module, and
 * the findings of commdebug check.
 */

/** The folder page's index of modules, ranks and findings (visualizer.ranks_data), checked. */
function parseRanks(text) {
  let index;
  try { index = JSON.parse(text); } catch (e) { throw new DumpError("The folder page's data is not valid JSON.", e.message); }
  if (!isObj(index) || index.format !== "commdebug-ranks") {
    throw new DumpError("This page's data is not a folder of ranks.", "Write it again with commdebug view FOLDER.");
  }
  return index;
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
    nodes.push(treeNode(i, fqn, parent, {
      raw: {fqn, module_type: str(types[typeIds[i]])},
      counts: {}, bytes: null, totalCount: 0, totalBytes: null, opTotals: new Map(),
    }));
  }
  const model = {
    cd: null, nodes, root: nodes[0], reference: false, events: null,
    byFqn: indexByFqn(nodes),
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

const NAMED_RANKS = 3;  // an extreme held by more ranks than this is counted, not listed

/** Who holds value `v` of a figure: "rank 733", "ranks 1, 2, 3", or "1,023 ranks tie at 260"
 * (a thousand rank numbers are no answer). `rows`: {rank, [key]}; `fmt` prints the value. */
function holders(rows, key, v, fmt) {
  const at = rows.filter((r) => r[key] === v).map((r) => str(r.rank.rank));
  if (at.length === 1) return `rank ${at[0]}`;
  if (at.length <= NAMED_RANKS) return `ranks ${at.join(", ")}`;
  return `${fmtCount(at.length)} ranks tie at ${fmt(v)}`;
}

/** The across-ranks line of a figure: "max rank 733; min rank 402", an extreme most ranks share
 * said once ("max rank 733; 1,023 ranks tie at 260"). */
function extremes(rows, key, st, fmt) {
  const max = holders(rows, key, st.max, fmt), min = holders(rows, key, st.min, fmt);
  const word = (m, text) => (text.includes(" tie at ") ? text : `${m} ${text}`);
  return `${word("max", max)}; ${word("min", min)}`;
}

// the format of a dump torch's own CommDebugMode wrote: counts only, no bytes
const REFERENCE_FORMAT = "torch.distributed.tensor.debug.CommDebugMode";

/** "24", or "24–25": the ranks' own collective counts. */
function callSpan(ranks) {
  const counts = ranks.map((r) => optNum(r.collectives)).filter((v) => v != null);
  if (!counts.length) return "—";
  const lo = Math.min(...counts), hi = Math.max(...counts);
  return lo === hi ? fmtCount(lo) : `${fmtCount(lo)}–${fmtCount(hi)}`;
}

/** Min, median (statistics.median's, as `commdebug summary` and `report` take it) and max of
 * the known values, and the middle values to mark (two for an even count, whose median is their mean). */
function spread(values) {
  const known = values.filter((v) => v != null).sort((a, b) => a - b);
  if (known.length === 0) return null;
  const n = known.length, mid = [known[Math.floor((n - 1) / 2)], known[Math.floor(n / 2)]];
  return {min: known[0], median: median(known), max: known.at(-1), mid};
}

class RanksViewer extends BaseViewer {
  constructor(index) {
    super();
    this.index = index;
    this.ranks = arr(index.ranks).filter(isObj);
    this.withTree = this.ranks.filter((r) => r.tree && isObj(r.blocks));
    if (this.withTree.length === 0) throw new DumpError("No rank in this folder has a module tree.", "");
    this.cache = new Map();
    this.check = isObj(index.check) ? index.check : {findings: []};
    this.model = buildRanksModel(index);
    showMode(true);
    showPredicted(null);
    const select = $("rank-select");
    select.replaceChildren(...this.withTree.map((r, i) => h("option", {value: i}, `${str(r.rank)}`)));
    select.onchange = () => this.setRank(this.withTree[Number(select.value)]);
    this.useRank(this.withTree[0]);
    this.renderSummary();
    this.renderFindings();
    this.heatmap = new Heatmap(this, index);
    this.heatmap.render();
    this.overlap = new OverlapChart(this, index);
    this.overlap.render();
    this.traffic = new TrafficPanel(index);
    this.traffic.render();
    this.showTree("share of this rank's bytes (Global = 100%)");
  }

  /** A heatmap cell (or a rank named by the per-op spread, `step` null) clicked: show that
   * rank in the tree and the rank panel, and the cell's calls by op. */
  selectCell(rank, step) {
    if (document.readyState === "loading") {  // its numbers are still being read in: once they are
      document.addEventListener("DOMContentLoaded", () => this.selectCell(rank, step), {once: true});
      return;
    }
    const entry = this.withTree.find((r) => r.rank === rank);
    if (entry && entry !== this.rank) this.setRank(entry);
    this.heatmap.mark(rank, step);
    this.heatmap.showSelection(rank, step);
  }

  /** A block of numbers (one rank's counts, bytes or exact times), parsed once; null while the
   * page is still reading it (a clicked cell's numbers come after the script). */
  block(id) {
    if (id == null) return null;
    if (!this.cache.has(id)) {
      const el = $(`block-${Number(id)}`);
      if (!el && document.readyState === "loading") return null;
      let values = null;
      try { values = el ? JSON.parse(el.textContent) : null; } catch (e) { values = null; }
      if (typeof values === "string") values = decodeFloats(values);  // times: exact doubles
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
    if (this.heatmap) {  // chosen elsewhere (the selector, the rank panel): its row, no step
      this.heatmap.mark(rank.rank, null);
      this.heatmap.showSelection(rank.rank, null);
    }
    this.renderSummary();
    this.tree.render();
    if (this.tree.selected) {
      this.renderDetail(this.tree.selected);
      this.revealRank();
    }
  }

  renderSummary() {
    const {index, check, rank} = this;
    const perRank = (c) => {
      const span = isObj(c.collectives_per_rank) ? c.collectives_per_rank : {};
      const lo = optNum(span.min), hi = optNum(span.max);
      return lo == null || hi == null ? "—" : lo === hi ? fmtCount(lo) : `${fmtCount(lo)}–${fmtCount(hi)}`;
    };
    const meta = isObj(rank.meta) ? rank.meta : {};
    const findings = arr(check.findings);
    const facts = [
      fact("ranks-count", "ranks", fmtCount(this.ranks.length)),
      fact("meta-world-size", "world size", str(meta.world_size ?? "—")),
      // no verdict (the calls name no group): the groups are not known, nor "consistent"
      fact("check-groups", "groups", check.no_verdict ? "not recorded" : fmtCount(optNum(check.groups))),
      // per rank, not summed over ranks: "24", or "24–25" when ranks differ (the check counts the
      // calls on known groups: without a verdict, the ranks' own counts)
      fact("check-collectives", "collectives per rank", check.no_verdict ? callSpan(this.ranks) : perRank(check)),
      // a node's folder: the verdict covers its ranks ("consistent among ranks 2-3 of 4")
      fact("check-status", "check", check.no_verdict ? "no verdict"
        : (findings.length ? counted(findings.length, "finding") : "consistent") + (check.among ? ` ${str(check.among)}` : "")),
      fact("meta-rank", "showing rank", str(rank.rank)),
      fact("meta-host", "host", str(meta.hostname ?? "—")),
      // worded in Python as `commdebug check` words it (its stream, its fault record, its error)
      fact("meta-ended", "ending", rank.ending == null ? "not recorded" : str(rank.ending)),
      fact("total-collectives", "collectives", fmtCount(optNum(rank.collectives))),
      // null: torch's own dumps record no bytes; a trace without shapes records calls of unknown size
      fact("total-bytes", "bytes", rank.bytes != null ? fmtBytes(rank.bytes) : rank.collectives && rank.format !== REFERENCE_FORMAT
        ? "?" : "not recorded"),
      fact("total-time", "time", rank.seconds == null ? "not timed" : fmtSeconds(rank.seconds)),
    ];
    // each rank says how it was recorded: ranks of one job normally agree, but a rank's own
    // detail steps are what its numbers rest on
    const light = lightCapture(meta);
    if (light) facts.push(light.fact);
    const notes = [
      ...(light ? [light.note] : []),
      ...arr(rank.notes).map(str),
      ...this.ranks.filter((r) => !r.tree).map((r) => `rank ${str(r.rank)} (${str(r.file)}): ${str(r.format)} dump, no module tree`),
      ...arr(index.errors).map((e) => `not read: ${str(e)}`),
    ];
    $("source").textContent = `— ${str(index.folder)}`;
    showSummary(facts, notes);
    $("summary").classList.toggle("inconsistent", findings.length > 0);
  }

  renderFindings() {
    const findings = arr(this.check.findings).filter(isObj);
    // each side as `commdebug check` prints it (worded in Python: visualizer.ranks_data), its
    // module a link into the tree
    const sideText = (side) => {
      const text = str(side.text), module = str(side.module);
      const node = module ? this.model.byFqn.get(module) : null;
      const at = node ? text.indexOf(` in ${module}`) : -1;
      if (at < 0) return h("li", {class: "side"}, text);
      const start = at + 4, end = start + module.length;
      return h("li", {class: "side"}, text.slice(0, start),
        h("a", {href: "#", class: "module-link", onclick: (ev) => { ev.preventDefault(); this.showModule(node); }}, module),
        text.slice(end));
    };
    const head = h("h2", null, "Check ", h("span", {class: "muted"},
      this.check.no_verdict ? "no verdict" : findings.length ? counted(findings.length, "finding") : "all ranks issued the same collectives"));
    if (this.check.no_verdict) {  // as `commdebug check` says it (exit 2), never "No findings."
      $("findings").replaceChildren(head, h("p", {class: "no-verdict"}, str(this.check.no_verdict)));
      return;
    }
    const list = h("ol", {id: "findings-list"}, ...findings.map((f) =>
      h("li", {class: "finding", "data-kind": str(f.kind), "data-group": str(f.group), "data-seq": f.seq ?? ""},
        h("span", {class: "badge kind"}, str(f.kind)), " ", h("span", {class: "message"}, str(f.text)),
        h("ul", {class: "sides"}, ...arr(f.sides).filter(isObj).map(sideText)))));
    const notes = arr(this.check.notes).map((n) => h("p", {class: "note"}, str(n)));
    $("findings").replaceChildren(head, findings.length ? list : h("p", {class: "muted empty"}, "No findings."), ...notes);
  }

  renderDetail(node) {
    this.node = node;
    const rows = this.withTree.map((r) => ({rank: r, ...this.numbers(r, node.idx)}));
    const stats = {calls: spread(rows.map((r) => r.calls)), bytes: spread(rows.map((r) => r.bytes)),
      seconds: spread(rows.map((r) => r.seconds))};
    const timed = rows.some((r) => r.seconds != null);
    const mark = (key) => (row) => {
      const st = stats[key], v = row[key];
      if (!st || v == null || st.min === st.max) return null;
      return [v === st.min && "min", st.mid.includes(v) && "median", v === st.max && "max"].filter(Boolean).join(" ") || null;
    };
    const columns = [
      {key: "rank", label: "rank", value: (r) => optNum(r.rank.rank), cls: "num"},
      ...PHASES.map((p) => ({key: p, label: PHASE_SHORT[p], cls: `num ${PHASE_SHORT[p]}`,
        value: (r) => (r.counts ? r.counts[p] : null), cell: (r) => fmtCount(r.counts ? r.counts[p] : null)})),
      {key: "calls", label: "calls", value: (r) => r.calls, cell: (r) => fmtCount(r.calls), cls: "num", cellCls: mark("calls")},
      {key: "bytes", label: "bytes", value: (r) => r.bytes, cell: (r) => (r.bytes == null && r.calls ? "?" : fmtBytes(r.bytes)),
        cls: "num", cellCls: mark("bytes")},
    ];
    if (timed) {
      columns.push({key: "time", label: "time", value: (r) => r.seconds, cell: (r) => fmtSeconds(r.seconds),
        cls: "num", cellCls: mark("seconds")});
    }
    const fmt = {calls: fmtCount, bytes: fmtBytes, seconds: fmtSeconds};
    const statRows = Object.entries(stats).filter(([key, st]) => st && (key !== "seconds" || timed)).map(([key, st]) =>
      h("tr", {"data-stat": key}, h("th", {scope: "row"}, key === "seconds" ? "time" : key),
        ...["min", "median", "max"].map((m) => h("td", {class: `num ${st.min === st.max ? "" : m}`,
          title: holders(rows, key, st[m], fmt[key])}, fmt[key](st[m]))),
        h("td", {class: "muted extremes"}, st.min === st.max ? "same on every rank" : extremes(rows, key, st, fmt[key]))));
    const flags = this.model.flags.get(node) || [];
    $("detail-body").replaceChildren(
      ...detailHead(node),
      // replaceChildren, unlike h(), writes a null child as the text "null": spread nothing instead
      ...(flags.length ? [h("ul", {id: "detail-findings", class: "flags"}, ...flags.map((f) =>
        h("li", {"data-kind": str(f.kind)}, h("span", {class: "badge kind"}, str(f.kind)), " ", str(f.text))))] : []),
      h("h3", null, "Across ranks ", h("span", {class: "muted"}, "descendants included; min, median and max marked")),
      h("div", {class: "table-wrap"}, h("table", {id: "rank-stats", class: "grid compact"},
        h("thead", null, h("tr", null, ...["", "min", "median", "max", ""].map((t) => h("th", {class: t && "num"}, t)))),
        h("tbody", null, ...statRows))),
      h("h3", null, "Per rank ", h("span", {class: "muted"}, "click a rank to show its numbers in the tree")),
      this.rankTable = pagedTable(columns, rows, {id: "rank-table", sortable: true, empty: "No ranks.", rowProps: (r) => ({
        class: r.rank === this.rank ? "current" : null, "data-rank": str(r.rank.rank),
        onclick: () => { if (r.rank !== this.rank) this.setRank(r.rank); },
      })}));
  }

  /** Bring the current rank's row of the per-rank table into view, loading rows up to it. */
  revealRank() {
    const el = this.rankTable && this.rankTable.reveal ? this.rankTable.reveal((r) => r.rank === this.rank) : null;
    const pane = el && el.closest(".pane");
    if (!pane) return;
    // scroll the detail pane only: a click on the heatmap must not move the page away from it
    const top = el.getBoundingClientRect().top - pane.getBoundingClientRect().top;
    if (top < 0 || top + el.offsetHeight > pane.clientHeight) pane.scrollTop += top - pane.clientHeight / 2;
  }
}
