/* The folder page's rank x step heatmap and per-op spread (visualizer.heat_data): communication
 * time per rank and step (bytes or calls when the run was not timed, or on the switch), outliers
 * marked, and per op the spread across ranks with the slowest ranks named. A thousand ranks do
 * not fit as rows of a readable height: wide worlds show groups of ranks per row (the group's
 * largest value, so one slow rank still shows), and the page says so.
 *
 * "wait caused" (timed jobs): the wait each rank made the others spend where it arrived last by
 * its own work, the waits it passed on through other ranks included and start-up skew left out
 * (commdebug check's analysis); its outliers are the late ranks `commdebug check` lists
 * (index.check.late_ranks, roots only), not a statistical rule, and a clicked cell lists that
 * rank's late calls of the step with the gap before each, the two lines around it, and the calls
 * its wait passed through.
 */

const HEAT_METRICS = {
  time: {label: "time", fmt: (v) => fmtSeconds(v), what: "communication time (sum of latencies)"},
  caused: {label: "wait caused", fmt: (v) => fmtSeconds(v),
    what: "wait caused: the time the others waited for this rank where it arrived last by its own work, waits it passed on included"},
  bytes: {label: "bytes", fmt: (v) => fmtBytes(v), what: "message bytes"},
  calls: {label: "calls", fmt: (v) => fmtCount(v), what: "collective calls"},
};
const HEAT_LEVELS = 9;      // colour classes .h0 (least) to .h8 (most), in viewer.css
const HEAT_MAX_ROWS = 128;  // more ranks than this: several per row
const HEAT_MAX_COLS = 128;  // more steps than this: several per column
const HEAT_HEIGHT = 480;    // px the grid aims to fill at most

/** A matrix of visualizer.heat_data (distinct rows and a row per rank) as one row per rank
 * (times in seconds; see decodedMatrices). */
function heatRows(m) {
  if (!isObj(m)) return [];
  const rows = arr(m.rows).map(arr);
  return arr(m.of).map((i) => rows[i] || []);
}

/** The heat block's matrices with their rows of times (exact doubles: decodeFloats) decoded,
 * once, so every view of the grid reads numbers. */
function decodedMatrices(m) {
  if (!isObj(m)) return {};
  for (const matrix of Object.values(m)) {
    if (isObj(matrix)) matrix.rows = arr(matrix.rows).map((r) => (typeof r === "string" ? decodeFloats(r) || [] : r));
  }
  return m;
}
/** A rank x step or rank x op matrix of one metric (times in seconds, exact: whatever the page
 * adds up from them is rounded once, when shown). */
const metricRows = (m, axis, metric) => heatRows(m[`${axis}_${metric}`]);

/** The late ranks `commdebug check` listed (its late_ranks): Map "rank:step" -> entry. */
function lateCells(check) {
  const out = new Map();
  for (const e of arr(isObj(check) ? check.late_ranks : null).filter(isObj)) out.set(`${str(e.rank)}:${str(e.step)}`, e);
  return out;
}

/** "all_reduce #5 on default_pg[4] at job.py:31" (a late entry's call site; group optional). */
function siteText(site, group) {
  if (!isObj(site)) return "";
  const what = site.seq == null ? str(site.op) : `${str(site.op)} #${str(site.seq)}`;
  const module = site.module && site.module !== "Global" ? ` in ${str(site.module)}` : "";
  return `${what}${group ? ` on ${str(group)}` : ""}${module}${site.source ? ` at ${str(site.source)}` : ""}`;
}

/** A late (step, rank)'s calls: the wait each caused, the gap before it and the two lines, and
 * the calls its wait passed through (other ranks came last there, held up by it). */
function lateDetail(entry) {
  const calls = arr(entry.calls).filter(isObj);
  const passed = (c) => {
    const through = arr(c.through).filter(isObj);
    if (through.length === 0) return null;
    return h("span", {class: "late-passed muted", "data-testid": "late-passed"},
      ` — passed on through ${through.map((t) => `${siteText(t, t.group)} (rank ${str(t.rank)} came last there)`).join(", ")}: `
      + `${fmtSeconds(optNum(c.chain_caused_s))} of waiting in all`);
  };
  return h("div", {"data-testid": "late-calls", class: "late-calls"},
    h("p", null, `Rank ${str(entry.rank)} arrived last here by its own work: the others waited for it.`),
    h("ol", null, ...calls.map((c) => h("li", {"data-seq": str(c.seq), "data-caused-s": str(c.caused_s)},
      h("span", {class: "late-call"}, `${siteText(c.before, c.group)}: made ${fmtCount(c.waited)} rank${c.waited === 1 ? "" : "s"} wait `
        + `${fmtSeconds(optNum(c.caused_s))} (${fmtSeconds(optNum(c.max_wait_s))} at most)`),
      c.gap_s == null || !c.after ? null : h("span", {class: "late-gap muted"},
        ` — its gap before it: ${fmtSeconds(optNum(c.gap_s))}, from ${siteText(c.after)} to `
        + `${siteText(c.before)}${c.others_gap_s == null ? "" : ` (the ranks that waited: ${fmtSeconds(optNum(c.others_gap_s))})`}`),
      passed(c)))));
}

/** Median and a robust standard deviation (1.4826 x the median absolute deviation). */
function robustStats(values) {
  const known = values.filter((v) => v != null).sort((a, b) => a - b);
  if (known.length === 0) return null;
  const mid = (xs) => (xs.length % 2 ? xs[(xs.length - 1) / 2] : (xs[xs.length / 2 - 1] + xs[xs.length / 2]) / 2);
  const med = mid(known);
  const dev = known.map((v) => Math.abs(v - med)).sort((a, b) => a - b);
  return {med, sd: 1.4826 * mid(dev), n: known.length};
}

/**
 * +1 (far above), -1 (far below) or 0: `v` against its column's stats. Far means beyond 3.5
 * robust deviations and a quarter of the median, so the ordinary spread of a job (a few per
 * cent) is never marked. Both ways count: a rank that arrives late waits least.
 */
function outlierSide(v, st) {
  if (v == null || !st || st.n < 3) return 0;
  const d = v - st.med, limit = Math.max(3.5 * st.sd, 0.25 * Math.abs(st.med));
  if (limit === 0 ? d === 0 : Math.abs(d) <= limit) return 0;
  return d > 0 ? 1 : -1;
}

/** `n` items in groups of `size`: [first, last] index of each group. */
function buckets(n, size) {
  const out = [];
  for (let i = 0; i < n; i += size) out.push([i, Math.min(n, i + size) - 1]);
  return out;
}

/** The value at quantile `q` of sorted numbers (nearest rank). */
const quantile = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];

/** The ranks a `commdebug check` finding singles out (its odd ranks, else its smallest side:
 * the rank that skipped a call), each with its findings: Map rank -> [{step, kind, message}]. */
function findingRanks(check) {
  const out = new Map();
  for (const f of arr(isObj(check) ? check.findings : null).filter(isObj)) {
    let ranks = arr(f.odd_ranks);
    if (ranks.length === 0) {
      const sides = arr(f.sides).filter(isObj).map((sd) => arr(sd.ranks));
      const fewest = sides.length > 1 ? sides.reduce((a, b) => (b.length < a.length ? b : a)) : [];
      if (sides.every((r) => r.length === fewest.length)) continue;  // a tie: no odd side
      ranks = fewest;
    }
    for (const r of ranks) {
      if (!out.has(r)) out.set(r, []);
      out.get(r).push({step: optNum(f.step), kind: str(f.kind), message: str(f.text)});
    }
  }
  return out;
}

/**
 * Which row labels to draw: every row in `must` (its label names an outlier or a flagged rank),
 * then the others every `every` rows where no drawn label is closer than `every` rows: labels
 * never overlap their neighbours, and the ones that matter are never thinned away.
 */
function labelRows(n, every, must) {
  const shown = new Set(must);
  const near = (i) => {
    for (let d = 1; d < every; d++) if (shown.has(i - d) || shown.has(i + d)) return true;
    return false;
  };
  for (let i = 0; i < n; i += every) if (!shown.has(i) && !near(i)) shown.add(i);
  return shown;
}

/** The by-op table of one (rank, step): rows {op, calls, bytes, seconds}; each row carries the
 * exact figures in data-* (data-time-s: the exact sum of the latencies, as embedded;
 * data-time-us: it times 1e6), whatever its text shows. */
function cellDetail(rows) {
  return h("table", {id: "cell-ops", "data-testid": "cell-detail", class: "grid compact"},
    h("thead", null, h("tr", null, ...["op", "calls", "bytes", "time"].map((t, j) => h("th", {class: j ? "num" : null}, t)))),
    h("tbody", null, ...rows.map((r) => h("tr", {"data-op": r.op, "data-calls": r.calls ?? "", "data-bytes": r.bytes ?? "",
      "data-time-s": r.seconds ?? "", "data-time-us": r.seconds == null ? "" : r.seconds * 1e6},
    h("td", null, opTag(r.op)), h("td", {class: "num"}, fmtCount(r.calls)),
    h("td", {class: "num"}, r.bytes == null && r.calls ? "?" : fmtBytes(r.bytes)), h("td", {class: "num"}, fmtSeconds(r.seconds))))));
}

class Heatmap {
  /** `viewer`: the RanksViewer (its block cache and selectCell); `index`: the page's index. */
  constructor(viewer, index) {
    this.viewer = viewer;
    const heat = isObj(index.heat) ? index.heat : {};
    this.steps = arr(heat.steps);
    this.ops = arr(heat.ops).map(str);
    this.chosen = isObj(heat.chosen) ? heat.chosen : {};
    this.ranks = arr(index.ranks).filter(isObj);
    this.m = {};
    const el = Number.isInteger(heat.block) ? $(`block-${heat.block}`) : null;
    try { if (el) this.m = JSON.parse(el.textContent); } catch (e) { console.warn("heatmap not shown:", e); }
    this.m = decodedMatrices(this.m);
    const any = (name) => heatRows(this.m[name]).some((row) => row.some((v) => v != null && v > 0));
    this.timed = !!heat.timed && any("step_time");
    this.caused = this.timed && isObj(this.m.step_caused);  // the late-rank analysis ran
    this.late = lateCells(index.check);
    this.flagged = findingRanks(index.check);
    this.metric = this.timed ? "time" : any("step_bytes") ? "bytes" : "calls";
    this.selected = null;  // {rank, step}
  }

  /** Rank x step values of the metric, and per step the stats and the outliers' sides. */
  compute() {
    const rows = metricRows(this.m, "step", this.metric);
    const stats = this.steps.map((_, j) => robustStats(rows.map((r) => r[j] ?? null)));
    const late = this.metric === "caused";  // its outliers: the late ranks listed, not a rule
    const sides = rows.map((r, i) => this.steps.map((s, j) => (late ? (this.late.has(`${str(this.ranks[i].rank)}:${str(s)}`) ? 1 : 0)
      : outlierSide(r[j] ?? null, stats[j]))));
    const totals = rows.map((r) => (r.some((v) => v != null) ? sum(r) : null));
    const rankStats = robustStats(totals);
    const stepTotals = this.steps.map((_, j) => stats[j] && stats[j].med);
    const stepStats = robustStats(stepTotals);
    return {
      rows, stats, sides,
      rankOut: rows.map((r, i) => sides[i].some((s) => s !== 0) || (!late && outlierSide(totals[i], rankStats) !== 0)),
      stepOut: this.steps.map((_, j) => sides.some((s) => s[j] !== 0) || (!late && outlierSide(stepTotals[j], stepStats) !== 0)),
    };
  }

  render() {
    const section = $("heatmap-section");
    if (this.steps.length === 0 || this.ranks.length === 0) {
      section.hidden = true;
      return;
    }
    section.hidden = false;
    const switcher = h("span", {id: "heat-metric", role: "radiogroup", "aria-label": "What the heatmap shows"},
      ...Object.entries(HEAT_METRICS).map(([key, m]) => {
        const off = (key === "time" && !this.timed) || (key === "caused" && !this.caused);
        return h("label", {title: off ? (key === "caused" && this.timed ? "no call was timed on every member of its group" : "not timed") : m.what},
          h("input", {type: "radio", name: "heat-metric", value: key, checked: key === this.metric, disabled: off,
            "data-testid": `heatmap-view-${key}`, onchange: () => { this.metric = key; this.draw(); }}), h("span", null, m.label));
      }));
    this.grid = h("div", {id: "rank-step-heatmap", "data-testid": "rank-step-heatmap", class: "heatmap", role: "grid",
      "aria-label": "ranks by steps"});
    this.grid.addEventListener("click", (ev) => this.onClick(ev));
    this.grid.addEventListener("mouseover", (ev) => this.onHover(ev));
    section.replaceChildren(
      h("div", {class: "section-head"}, h("h2", null, "Ranks × steps ", h("span", {id: "heat-what", class: "muted"})), switcher),
      h("p", {id: "heat-note", class: "note"}),
      h("div", {class: "heat-body"},
        h("div", {class: "heat-left"}, this.grid, h("div", {id: "heat-legend", class: "legend"}),
          h("p", {id: "heatmap-hover", class: "muted", "aria-live": "polite"}, "Point at a cell for its figures; click it to show that rank."),
          h("div", {id: "heatmap-selection"})),
        h("div", {id: "op-spread-wrap", class: "heat-right"})));
    this.draw();
  }

  /** (Re)draw the grid, legend and per-op spread for the current metric. */
  draw() {
    const t0 = performance.now();
    const c = this.c = this.compute();
    const nr = this.ranks.length, ns = this.steps.length;
    const rowSize = Math.ceil(nr / HEAT_MAX_ROWS), colSize = Math.ceil(ns / HEAT_MAX_COLS);
    this.rowGroups = buckets(nr, rowSize);
    this.colGroups = buckets(ns, colSize);
    let lo = Infinity, hi = -Infinity;
    for (const row of c.rows) {
      for (const v of row) {
        if (v == null) continue;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      }
    }
    if (lo > hi) lo = hi = 0;
    lo = Math.min(lo, 0);  // from zero: a pale cell is little, not merely the least
    this.scale = {lo, hi};
    const level = (v) => (hi > lo ? Math.min(HEAT_LEVELS - 1, Math.floor(((v - lo) / (hi - lo)) * HEAT_LEVELS)) : HEAT_LEVELS - 1);
    const rowH = Math.max(4, Math.min(18, Math.floor(HEAT_HEIGHT / this.rowGroups.length)));
    const labelEvery = Math.ceil(12 / rowH);
    const colLabelEvery = Math.max(1, Math.ceil(this.colGroups.length / 25));
    const grid = this.grid;
    grid.style.setProperty("--cols", String(this.colGroups.length));
    grid.style.setProperty("--row-h", `${rowH}px`);
    const frag = document.createDocumentFragment();
    const label = (cls, text, out) => {
      const el = document.createElement("div");
      el.className = cls + (out ? " outlier" : "");
      el.textContent = text;
      return el;
    };
    frag.append(label("corner", "rank \\ step"));
    const rowInfo = this.rowGroups.map(([a, b]) => this.rowFacts(a, b));
    const labelled = labelRows(this.rowGroups.length, labelEvery,
      rowInfo.map((f, i) => (f.outlier != null || f.flagged != null ? i : -1)).filter((i) => i >= 0));
    this.colGroups.forEach(([a, b], j) => {
      const el = label("col-label", j % colLabelEvery ? "" : str(this.steps[a]), this.stepRange(a, b).some((k) => c.stepOut[k]));
      el.dataset.step = str(this.steps[a]);
      frag.append(el);
    });
    this.rowGroups.forEach(([a, b], i) => {
      frag.append(this.rowLabel(a, b, rowInfo[i], labelled.has(i)));
      this.colGroups.forEach(([sa, sb]) => {
        // the block's largest value (one slow rank must show); it names an outlier rank when
        // it holds one, else the rank with that largest value
        let value = null, who = a, side = 0;
        for (let r = a; r <= b; r++) {
          let v = null, s = 0;
          for (let k = sa; k <= sb; k++) {
            const x = c.rows[r][k];
            if (x != null) v = (v ?? 0) + x;
            if (c.sides[r][k] !== 0 && s === 0) s = c.sides[r][k];
          }
          if (s !== 0 && side === 0) { side = s; who = r; }
          if (v != null && (value == null || v > value)) { value = v; if (side === 0) who = r; }
        }
        const cell = document.createElement("div");
        // no value: "none" where no rank of the block made a call, else "unknown" (not timed, size not recorded)
        const empty = value == null && this.rankRange(a, b).some((r) => this.callsAt(r, sa, sb)) ? "cell unknown" : "cell none";
        cell.className = value == null ? empty : `cell h${level(value)}` + (side ? ` outlier ${side > 0 ? "high" : "low"}` : "");
        const flagged = this.flaggedAt(a, b, sa, sb);
        if (flagged != null) {  // a rank check singles out, at the finding's step: marked on every view
          cell.classList.add("flagged");
          cell.dataset.findingRank = str(this.ranks[flagged].rank);
          if (side === 0) who = flagged;
        }
        cell.dataset.rank = str(this.ranks[who].rank);
        cell.dataset.step = str(this.steps[sa]);
        if (a !== b) cell.dataset.ranks = `${str(this.ranks[a].rank)}-${str(this.ranks[b].rank)}`;
        if (sa !== sb) cell.dataset.steps = `${str(this.steps[sa])}-${str(this.steps[sb])}`;
        cell.dataset.col = String(sa);
        frag.append(cell);
      });
    });
    grid.replaceChildren(frag);
    const m = HEAT_METRICS[this.metric];
    $("heat-what").textContent = `${m.what} per rank and step`;
    const notes = [];
    if (rowSize > 1) notes.push(`${fmtCount(nr)} ranks: each row is ${rowSize} consecutive ranks and shows the largest of them (outliers name their rank).`);
    if (colSize > 1) notes.push(`${fmtCount(ns)} steps: each column sums ${colSize} consecutive steps.`);
    if (this.chosen.ranks && this.chosen.ranks !== "all") notes.push(`Ranks ${str(this.chosen.ranks)} only (--ranks).`);
    if (this.chosen.steps && this.chosen.steps !== "all") notes.push(`Steps ${str(this.chosen.steps)} only (--steps); the tree's numbers cover every step.`);
    if (!this.timed) notes.push("Not timed: bytes and calls only (record with --timing); the wait a late rank caused needs timing too.");
    if (this.metric === "caused") {
      notes.push(this.late.size ? `Marked: the ${fmtCount(this.late.size)} (rank, step) pair${this.late.size === 1 ? "" : "s"} where a rank arrived `
        + "last by its own work and made another wait over the threshold of `commdebug report` (click one for its calls)."
        : "No rank made another wait over the threshold of `commdebug report`: the colours are jitter.");
      notes.push("Start-up skew (the processes reaching their first collective apart) is in no cell: `commdebug report` lists it.");
    }
    $("heat-note").textContent = notes.join(" ");
    this.drawLegend();
    this.drawSpread();
    if (this.selected) this.mark(this.selected.rank, this.selected.step);
    performance.measure?.("commdebug:heatmap", {start: t0});
  }

  /** Row a..b (rank indices): its first outlier rank and first flagged rank (indices), if any. */
  rowFacts(a, b) {
    let outlier = null, flagged = null;
    for (let r = a; r <= b; r++) {
      if (outlier == null && this.c.rankOut[r]) outlier = r;
      if (flagged == null && this.flagged.has(this.ranks[r].rank)) flagged = r;
    }
    return {outlier, flagged};
  }

  /** The label of the row of ranks a..b: its ranks ("1008–1015"), and the outlier or flagged
   * rank it holds named first ("733 in 728–735"), so the culprit's row is never unlabelled. */
  rowLabel(a, b, facts, shown) {
    const first = str(this.ranks[a].rank), span = a === b ? first : `${first}–${str(this.ranks[b].rank)}`;
    const named = facts.outlier ?? facts.flagged;
    const el = h("div", {class: "row-label" + (facts.outlier != null ? " outlier" : "") + (facts.flagged != null ? " flagged" : ""),
      "data-testid": "heatmap-row-label", "data-rank": first});
    if (a !== b) el.dataset.ranks = `${first}-${str(this.ranks[b].rank)}`;
    if (facts.outlier != null) el.dataset.outlierRank = str(this.ranks[facts.outlier].rank);
    if (facts.flagged != null) {
      const rank = this.ranks[facts.flagged].rank;
      el.dataset.findingRank = str(rank);
      el.title = this.flagged.get(rank).map((f) => `rank ${str(rank)}: ${f.message}`).join("\n");
    }
    if (!shown) return el;
    const who = named == null || a === b ? span : `${str(this.ranks[named].rank)} in ${span}`;
    el.append(...(facts.flagged != null ? [h("span", {class: "finding-mark", "aria-label": "check finding"}, "⚠"), " "] : []), who);
    return el;
  }

  /** The index of a rank of a..b that a finding at one of steps sa..sb singles out, or null. */
  flaggedAt(a, b, sa, sb) {
    if (this.flagged.size === 0) return null;
    for (let r = a; r <= b; r++) {
      const found = this.flagged.get(this.ranks[r].rank);
      if (!found) continue;
      for (let k = sa; k <= sb; k++) if (found.some((f) => f.step === this.steps[k])) return r;
    }
    return null;
  }

  /** Indices a..b, both included. */
  rankRange(a, b) { return Array.from({length: b - a + 1}, (_, i) => a + i); }
  stepRange(a, b) { return this.rankRange(a, b); }

  drawLegend() {
    const {lo, hi} = this.scale, fmt = HEAT_METRICS[this.metric].fmt;
    const swatches = [];
    for (let i = 0; i < HEAT_LEVELS; i++) {
      swatches.push(h("span", {class: `swatch h${i}`, title: `${fmt(lo + ((hi - lo) * i) / HEAT_LEVELS)} – ${fmt(lo + ((hi - lo) * (i + 1)) / HEAT_LEVELS)}`}));
    }
    const outlier = this.metric === "caused" ? "late rank: it arrived last and made another wait over the threshold"
      : "outlier: far from the step's median across ranks (high or low: a late rank waits least)";
    $("heat-legend").replaceChildren(h("span", {class: "muted"}, fmt(lo)), ...swatches, h("span", {class: "muted"}, fmt(hi)),
      h("span", {class: "swatch outlier high"}), h("span", {class: "muted"}, outlier),
      h("span", {class: "swatch none"}), h("span", {class: "muted"}, "no calls"),
      h("span", {class: "swatch unknown"}), h("span", {class: "muted"}, this.metric === "time" ? "calls not timed"
        : this.metric === "bytes" ? "calls of unknown size" : "not known"));
  }

  /** Per op, the metric's spread across ranks: min, median, p90, max, and the top ranks. */
  drawSpread() {
    if (this.metric === "caused") {  // a wait is caused per call, not per op
      $("op-spread-wrap").replaceChildren(h("h3", null, "Per op across ranks"),
        h("p", {class: "muted"}, "The wait caused is counted per call, not per op: click a marked cell for the late rank's calls."));
      return;
    }
    const rows = metricRows(this.m, "op", this.metric), calls = heatRows(this.m.op_calls);
    const fmt = HEAT_METRICS[this.metric].fmt;
    const body = this.ops.map((op, j) => {
      const values = rows.map((r, i) => ({v: r[j] ?? null, i})).filter((x) => x.v != null);
      const sorted = values.map((x) => x.v).sort((a, b) => a - b);
      const perRank = calls.map((r) => r[j]).filter((v) => v != null);
      const top = values.sort((a, b) => b.v - a.v || a.i - b.i).slice(0, 3);
      // the median as `commdebug summary`'s per-rank median (the mean of the two middle ranks' of an even count)
      const cells = sorted.length ? [sorted[0], median(sorted), quantile(sorted, 0.9), sorted.at(-1)] : [null, null, null, null];
      const callSpan = perRank.length ? (Math.min(...perRank) === Math.max(...perRank) ? fmtCount(perRank[0])
        : `${fmtCount(Math.min(...perRank))}–${fmtCount(Math.max(...perRank))}`) : "—";
      // the top ranks right after the op: the column that names the culprit is never scrolled away
      return h("tr", {"data-op": op}, h("td", null, opTag(op)),
        h("td", {class: "top-ranks"}, ...top.flatMap((x, k) => [k ? ", " : "", h("a", {href: "#", class: "rank-link",
          "data-rank": str(this.ranks[x.i].rank), title: `rank ${str(this.ranks[x.i].rank)}: ${fmt(x.v)}`,
          onclick: (ev) => { ev.preventDefault(); this.viewer.selectCell(this.ranks[x.i].rank, null); }},
        str(this.ranks[x.i].rank))])),
        h("td", {class: "num"}, fmtCount(values.length)),
        h("td", {class: "num"}, callSpan), ...cells.map((v) => h("td", {class: "num"}, v == null ? "—" : fmt(v))));
    });
    $("op-spread-wrap").replaceChildren(
      h("h3", null, "Per op across ranks ", h("span", {class: "muted"}, `${HEAT_METRICS[this.metric].label} per rank, all steps shown`)),
      h("div", {class: "table-wrap"}, h("table", {id: "op-spread", class: "grid compact"},
        h("thead", null, h("tr", null, ...["op", "top ranks", "ranks", "calls per rank", "min", "median", "p90", "max"].map((t, k) =>
          h("th", {class: k > 1 ? "num" : null}, t)))),
        h("tbody", null, ...body))));
  }

  /** The figures of the cell under the pointer, in the line below the grid. */
  onHover(ev) {
    const cell = ev.target.closest && ev.target.closest(".cell");
    if (!cell) return;
    $("heatmap-hover").textContent = this.describe(cell);
  }

  describe(cell) {
    const k = Number(cell.dataset.col), fmt = HEAT_METRICS[this.metric].fmt;
    const rankIdx = this.ranks.findIndex((x) => str(x.rank) === cell.dataset.rank);
    const [sa, sb] = this.colGroups.find(([a, b]) => a <= k && k <= b) || [k, k];
    let v = null;
    for (let j = sa; rankIdx >= 0 && j <= sb; j++) {
      const x = this.c.rows[rankIdx][j];
      if (x != null) v = (v ?? 0) + x;
    }
    const st = sa === sb ? this.c.stats[k] : null;  // a step's median; none for a block of steps
    const who = cell.dataset.ranks ? `ranks ${cell.dataset.ranks} (rank ${cell.dataset.rank} shown)` : `rank ${cell.dataset.rank}`;
    const when = cell.dataset.steps ? `steps ${cell.dataset.steps}` : `step ${cell.dataset.step}`;
    const ratio = v != null && st && st.med > 0 ? `, ${(v / st.med).toFixed(1)}× the step's median ${fmt(st.med)}` : st ? `, step median ${fmt(st.med)}` : "";
    const late = this.metric === "caused" ? this.late.get(`${cell.dataset.rank}:${cell.dataset.step}`) : null;
    const out = late ? ` — late rank: made ${fmtCount(late.waited)} rank${late.waited === 1 ? "" : "s"} wait ${fmtSeconds(optNum(late.caused_s))} in ${siteText(late.before, late.group)}`
      : cell.classList.contains("outlier") ? (cell.classList.contains("high") ? " — outlier (high)" : " — outlier (low)") : "";
    return `${who} · ${when} · ${HEAT_METRICS[this.metric].label} ${v == null ? this.missing(rankIdx, sa, sb) : fmt(v)}${ratio}${out}`;
  }

  /** The calls of rank `i` in steps sa..sb (null: none recorded). */
  callsAt(i, sa, sb) {
    const row = i >= 0 ? metricRows(this.m, "step", "calls")[i] || [] : [];
    let n = null;
    for (let j = sa; j <= sb; j++) if (row[j] != null) n = (n ?? 0) + row[j];
    return n;
  }

  /** What a cell with no value of the metric says: "no calls" only where the rank made none;
   * calls the metric knows nothing of (not timed, sizes not recorded) are said so, with their count. */
  missing(i, sa, sb) {
    const n = this.callsAt(i, sa, sb);
    if (!n) return "no calls";
    const calls = `${fmtCount(n)} call${n === 1 ? "" : "s"}`;
    if (this.metric === "time") return `not timed (${calls})`;
    if (this.metric === "bytes") return `? (${calls} of unknown size)`;
    return `not known (${calls})`;
  }

  onClick(ev) {
    const cell = ev.target.closest && ev.target.closest(".cell");
    if (!cell) return;
    this.viewer.selectCell(Number(cell.dataset.rank), Number(cell.dataset.step));
  }

  /** Mark the cell of (rank, step) (step null: the rank's row) as selected. */
  mark(rank, step) {
    this.selected = {rank, step};
    const grid = this.grid;
    if (!grid) return;
    for (const el of grid.querySelectorAll(".selected")) el.classList.remove("selected");
    grid.dataset.selectedRank = str(rank);
    if (step == null) delete grid.dataset.selectedStep;
    else grid.dataset.selectedStep = str(step);
    const i = this.ranks.findIndex((x) => x.rank === rank);
    const row = this.rowGroups.findIndex(([a, b]) => a <= i && i <= b);
    const k = step == null ? -1 : this.steps.indexOf(step);
    const col = this.colGroups.findIndex(([a, b]) => a <= k && k <= b);
    const stride = this.colGroups.length + 1;
    const children = grid.children;
    if (row >= 0) children[stride * (row + 1)].classList.add("selected");
    if (col >= 0) children[col + 1].classList.add("selected");
    if (row >= 0 && col >= 0) children[stride * (row + 1) + col + 1].classList.add("selected");
  }

  /** What the selected (rank, step) holds, by op: calls, bytes and time. */
  showSelection(rank, step) {
    const entry = this.ranks.find((x) => x.rank === rank);
    const box = $("heatmap-selection");
    if (!entry || step == null) {
      box.replaceChildren();
      return;
    }
    const cells = isObj(entry.cells) ? entry.cells : {};
    const keys = this.viewer.block(cells.keys) || [], calls = this.viewer.block(cells.calls) || [];
    const bytes = this.viewer.block(cells.bytes) || [], seconds = this.viewer.block(cells.time_s);
    const rows = [];
    for (let i = 0; 2 * i + 1 < keys.length; i++) {
      if (keys[2 * i] !== step) continue;
      rows.push({op: str(this.ops[keys[2 * i + 1]]), calls: optNum(calls[i]), bytes: optNum(bytes[i]),
        seconds: seconds ? optNum(seconds[i]) : null});
    }
    const k = this.steps.indexOf(step), st = k >= 0 ? this.c.stats[k] : null, fmt = HEAT_METRICS[this.metric].fmt;
    const late = this.late.get(`${str(rank)}:${str(step)}`);
    box.replaceChildren(
      h("h3", null, `Rank ${str(rank)}, step ${str(step)} `, h("span", {class: "muted"},
        st ? `the step's median across ranks: ${fmt(st.med)} (${HEAT_METRICS[this.metric].label})` : "")),
      ...(late ? [lateDetail(late)] : []),
      rows.length ? cellDetail(rows) : h("p", {class: "muted empty"}, "No calls on this rank at this step."));
  }
}
