/* The folder page's exposed communication (visualizer.overlap_data: `commdebug overlap --by
 * step`'s rows of each profiled rank, computed in Python): per rank and profiled step, one bar
 * of the step's busy time (compute or communication running) in three parts, the exposed one in
 * two shades where its split is known (waiting for a late peer, then transfer), every bar on one
 * scale. Nothing is recomputed here but the compute-only part (compute less overlapped) and the
 * transfer (exposed less waiting). The ranks with the most exposed time come first; past
 * OVERLAP_TOP ranks the rest wait behind "Show all", so a thousand ranks cost nothing until asked
 * for.
 */

const OVERLAP_TOP = 16;  // ranks drawn before "Show all"
// the bar's parts, in order: class, name, and what it is (docs/overlap.md's definitions)
const OVERLAP_PARTS = [
  ["compute", "compute only", "compute with no communication under it"],
  ["overlapped", "overlapped", "communication under compute"],
  ["exposed", "exposed", "communication not under compute: the rank waits for it"],
];
// the exposed part's two shades, where every member of its calls was profiled
const EXPOSED_SPLIT = [
  ["exposed wait", "waiting", "exposed, waiting for a late peer to arrive (the late rank's fix, not overlap's)"],
  ["exposed transfer", "transfer", "exposed, moving the data (prefetch, bucket sizes or less data shrink it)"],
];
const OUTSIDE_WINDOW = "outside HTA's window: the trace's last step, usually cut short; " +
  "commdebug overlap's whole-rank figures leave it out";

/** "rank 3", "ranks 2, 5", or "40 ranks (2, 5, 9, …)": ranks named, a few at most. */
function rankList(ranks) {
  if (ranks.length === 1) return `rank ${str(ranks[0])}`;
  if (ranks.length <= 6) return `ranks ${ranks.map(str).join(", ")}`;
  return `${fmtCount(ranks.length)} ranks (${ranks.slice(0, 3).map(str).join(", ")}, …)`;
}

class OverlapChart {
  /** `viewer`: the RanksViewer (selectCell); `index`: the page's index. */
  constructor(viewer, index) {
    this.viewer = viewer;
    const o = isObj(index.overlap) ? index.overlap : null;
    this.present = o !== null;
    const columns = o ? arr(o.columns).map(str) : [];
    const at = Object.fromEntries(columns.map((c, i) => [c, i]));
    let blocks = [];
    const el = o && Number.isInteger(o.block) ? $(`block-${o.block}`) : null;
    try { if (el) blocks = arr(JSON.parse(el.textContent)); } catch (e) { console.warn("exposed communication not shown:", e); }
    this.ranks = [];      // {rank, steps: [{step, calls, comm, overlapped, exposed, compute, inWindow}], exposed}; microseconds
    this.without = [];    // ranks with no profile
    this.stepless = [];   // ranks whose profile has no ProfilerStep (or none in --steps)
    this.leftOut = o ? arr(o.left_out) : [];  // profiled, but past the page's limit
    this.limit = o && isObj(o.limits) ? optNum(o.limits.rows) : null;
    const chosen = isObj(index.heat) && isObj(index.heat.chosen) ? index.heat.chosen : {};
    this.chosenSteps = chosen.steps && chosen.steps !== "all" ? str(chosen.steps) : null;  // --steps
    const leftOut = new Set(this.leftOut);
    arr(index.ranks).forEach((entry, i) => {
      if (!isObj(entry)) return;
      const flat = blocks[i];
      if (!Array.isArray(flat)) {
        if (!leftOut.has(entry.rank)) this.without.push(entry.rank);
        return;
      }
      const steps = [];
      for (let k = 0; columns.length && k + columns.length <= flat.length; k += columns.length) {
        const v = (name) => flat[k + at[name]];
        const overlapped = optNum(v("overlapped_us")), exposed = optNum(v("exposed_us"));
        const wait = "exposed_wait_us" in at && exposed != null ? optNum(v("exposed_wait_us")) : null;
        steps.push({step: v("step"), calls: optNum(v("calls")), overlapped, exposed, compute: optNum(v("compute_us")),
          comm: overlapped == null || exposed == null ? null : overlapped + exposed, inWindow: v("in_window") !== 0,
          wait, transfer: wait == null ? null : Math.max(0, exposed - wait)});
      }
      if (steps.length === 0) this.stepless.push(entry.rank);
      // the order: exposed time over the steps commdebug overlap's rank figures cover
      else this.ranks.push({rank: entry.rank, steps, exposed: sum(steps.filter((s) => s.inWindow).map((s) => s.exposed))});
    });
    this.ranks.sort((a, b) => b.exposed - a.exposed || num(a.rank) - num(b.rank));
    const all = this.ranks.flatMap((r) => r.steps);
    this.steps = [...new Set(all.map((s) => s.step))].sort((a, b) => num(a) - num(b));
    this.outside = new Set(all.filter((s) => !s.inWindow).map((s) => s.step));
    // one scale for every bar, shown or not: "Show all" must not change a bar's length
    this.scale = Math.max(0, ...all.map((s) => num(s.compute) + num(s.exposed)));
    this.split = all.some((s) => s.wait != null);  // some bar's exposed time is split
    this.unsplit = [...new Set(this.ranks.filter((r) => r.steps.some((s) => s.wait == null && num(s.exposed) > 0)).map((r) => r.rank))];
    this.all = false;
  }

  render() {
    const section = $("overlap-section");
    section.hidden = !this.present;
    if (!this.present) return;
    this.chart = h("div", {id: "overlap-chart", "data-testid": "overlap-chart", class: "overlap-chart"});
    this.chart.addEventListener("click", (ev) => this.onClick(ev));
    this.toggle = h("button", {type: "button", id: "overlap-all", onclick: () => { this.all = !this.all; this.draw(); }});
    section.replaceChildren(
      h("div", {class: "section-head"}, h("h2", null, "Exposed communication ", h("span", {class: "muted"},
        "per rank and profiled step: the step's busy time as compute only, overlapped and exposed" +
        `${this.split ? " (waiting for a late peer, then transfer)" : ""} (commdebug overlap --by step)`))),
      h("div", {id: "overlap-legend", class: "legend"}, ...OVERLAP_PARTS.concat(this.split ? EXPOSED_SPLIT : []).flatMap(([cls, name, what]) => [
        h("span", {class: `swatch ${cls.split(" ").map((c) => `ov-${c}`).join(" ")}`}),
        h("span", {class: "muted"}, h("strong", null, name), ` = ${what}; `)]),
      h("span", {class: "muted"}, `* ${OUTSIDE_WINDOW}.`)),
      h("p", {id: "overlap-note", class: "note"}),
      h("div", {class: "overlap-wrap"}, this.chart),
      this.toggle);
    this.draw();
  }

  draw() {
    const shown = this.all ? this.ranks : this.ranks.slice(0, OVERLAP_TOP);
    const chart = this.chart;
    chart.style.setProperty("--cols", String(this.steps.length));
    const frag = document.createDocumentFragment();
    frag.append(h("div", {class: "ov-row ov-head"}, h("div", {class: "corner"}, "rank \\ step"), ...this.steps.map((step) => {
      const out = this.outside.has(step);
      return h("div", {class: "col-label" + (out ? " outside" : ""), "data-step": step, title: out ? OUTSIDE_WINDOW : null},
        `step ${str(step)}${out ? "*" : ""}`);
    })));
    for (const r of shown) {  // a row per rank: the browser lays out only the rows in view (viewer.css)
      const row = h("div", {class: "ov-row"}, h("div", {class: "row-label"}, h("a", {href: "#", class: "rank-link", "data-rank": r.rank,
        title: `rank ${str(r.rank)}: ${fmtSeconds(r.exposed * 1e-6)} exposed over its steps in HTA's window; click to show this rank`},
      `rank ${str(r.rank)}`)));
      const byStep = new Map(r.steps.map((s) => [s.step, s]));
      for (const step of this.steps) {
        const s = byStep.get(step);
        row.append(s ? this.bar(r.rank, s) : h("div", {class: "ov-cell muted"}, "not profiled"));
      }
      frag.append(row);
    }
    chart.replaceChildren(frag);
    const n = this.ranks.length, notes = [];
    if (n > 1) notes.push("Ranks with the most exposed time first (over their steps in HTA's window).");
    if (n > OVERLAP_TOP) notes.push(this.all ? `All ${fmtCount(n)} profiled ranks shown.` : `The ${OVERLAP_TOP} of ${fmtCount(n)} profiled ranks with the most exposed time shown.`);
    notes.push("A bar's length is the step's busy time (compute or communication running), on one scale for all; point at it for its figures.");
    if (this.chosenSteps) notes.push(`Steps ${this.chosenSteps} only (--steps).`);
    if (this.stepless.length) {
      notes.push(`${rankList(this.stepless)}: no per-step figures (a profile with no ProfilerStep` +
        `${this.chosenSteps ? ", or none of its steps in --steps" : ""}; commdebug overlap has its whole figures).`);
    }
    if (this.leftOut.length) {
      notes.push(`${rankList(this.leftOut)} with the least exposed time are not in the page (at most ${fmtCount(this.limit)} ` +
        "rank and step bars are embedded): commdebug overlap --by step --json has them all.");
    }
    if (this.without.length) notes.push(`${rankList(this.without)}: no profile (record with commdebug run --profile-steps).`);
    if (this.unsplit.length) {
      notes.push(`${rankList(this.unsplit)}: exposed time not split into waiting and transfer (it needs every member of each ` +
        "call profiled in this folder).");
    }
    $("overlap-note").textContent = notes.join(" ");
    this.toggle.hidden = n <= OVERLAP_TOP;
    this.toggle.textContent = this.all ? `Show the ${OVERLAP_TOP} with most exposed time` : `Show all ${fmtCount(n)} ranks`;
  }

  /** One (rank, step)'s bar: its exact microseconds in data-*, its three parts, and a caption. */
  bar(rank, s) {
    const computeOnly = s.compute == null || s.overlapped == null ? null : Math.max(0, s.compute - s.overlapped);
    const bar = h("div", {class: "ov-bar" + (s.inWindow ? "" : " outside"), "data-testid": "overlap-bar", "data-rank": rank,
      "data-step": s.step, "data-exposed-us": s.exposed ?? "", "data-overlapped-us": s.overlapped ?? "",
      "data-compute-us": s.compute ?? "", "data-calls": s.calls ?? "", "data-wait-us": s.wait ?? "",
      "data-in-window": String(s.inWindow), title: this.describe(rank, s, computeOnly)});
    const busy = num(s.compute) + num(s.exposed);
    bar.style.setProperty("width", `${this.scale > 0 ? ((100 * busy) / this.scale).toFixed(2) : 0}%`);
    const parts = [["compute", computeOnly], ["overlapped", s.overlapped]].concat(
      s.wait == null ? [["exposed", s.exposed]] : [["exposed wait", s.wait], ["exposed transfer", s.transfer]]);
    const whole = sum(parts.map(([, v]) => num(v)));
    for (const [cls, v] of parts) {
      const part = h("span", {class: `ov-part ${cls.split(" ").map((c) => `ov-${c}`).join(" ")}`});
      // from a zero basis, grow factors summing to 1: each part its share of the bar
      part.style.setProperty("flex-grow", String(whole > 0 ? num(v) / whole : 0));
      bar.append(part);
    }
    return h("div", {class: "ov-cell"}, h("div", {class: "ov-track"}, bar),
      h("span", {class: "ov-caption"}, s.exposed == null ? "—" : `${fmtSeconds(s.exposed * 1e-6)} exposed`));
  }

  /** The bar's hover title: every figure, each rounded once (3 significant digits). */
  describe(rank, s, computeOnly) {
    const sec = (us) => fmtSeconds(us == null ? null : us * 1e-6);
    const share = s.comm > 0 && s.overlapped != null ? `, ${((100 * s.overlapped) / s.comm).toFixed(1)}% of it overlapped` : "";
    const split = s.wait == null ? "" : ` (waiting ${sec(s.wait)}, transfer ${sec(s.transfer)})`;
    return `rank ${str(rank)} · step ${str(s.step)}${s.inWindow ? "" : ` (${OUTSIDE_WINDOW})`}\n` +
      `compute only ${sec(computeOnly)} · overlapped ${sec(s.overlapped)} · exposed ${sec(s.exposed)}${split}\n` +
      `communication ${sec(s.comm)} in ${counted(s.calls ?? 0, "call")}${share}; compute ${sec(s.compute)}`;
  }

  onClick(ev) {
    const target = ev.target.closest && ev.target.closest("[data-rank]");
    if (!target) return;
    ev.preventDefault();
    const step = target.dataset.step;
    this.viewer.selectCell(Number(target.dataset.rank), step == null ? null : Number(step));
  }
}
