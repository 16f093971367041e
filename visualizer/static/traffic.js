/* The folder page's traffic between ranks (visualizer.traffic_data, computed in Python from
 * `summary --by peer` per step and `report`'s all_to_all imbalance; nothing is recomputed
 * here): for a chosen group and step, the rank x rank matrix of bytes sent (row: sender,
 * column: receiver), and beside it the group's imbalance per step (the received bytes' max over
 * mean in the step's most uneven all_to_all, and the rank that received most). A group over
 * limits.members members embeds each step's heaviest pairs only, listed as a table; past
 * limits.cells pairs in all, a group's least uneven steps are left out. The page says which.
 */

class TrafficPanel {
  constructor(index) {
    const t = isObj(index.traffic) ? index.traffic : null;
    this.groups = t ? arr(t.groups).filter(isObj) : [];
    this.imbalance = t && isObj(t.imbalance) ? t.imbalance : {};
    this.limits = t && isObj(t.limits) ? t.limits : {};
    this.imbalanceTotal = t ? optNum(t.imbalance_total) : null;
    this.cells = [];
    const el = t && Number.isInteger(t.block) ? $(`block-${t.block}`) : null;
    try { if (el) this.cells = arr(JSON.parse(el.textContent)); } catch (e) { console.warn("traffic not shown:", e); }
    this.group = 0;
    this.step = null;
  }

  render() {
    const section = $("traffic-section");
    if (this.groups.length === 0) {
      section.hidden = true;
      return;
    }
    section.hidden = false;
    const groupSelect = h("select", {id: "traffic-group", "aria-label": "Group"},
      ...this.groups.map((g, i) => h("option", {value: i}, `${str(g.group)} (${counted(arr(g.members).length, "rank")})`)));
    groupSelect.onchange = () => { this.group = Number(groupSelect.value); this.step = null; this.draw(); };
    this.stepSelect = h("select", {id: "traffic-step", "aria-label": "Step"});
    this.stepSelect.onchange = () => { this.step = Number(this.stepSelect.value); this.draw(); };
    section.replaceChildren(
      h("div", {class: "section-head"}, h("h2", null, "Traffic between ranks ",
        h("span", {class: "muted"}, "bytes sent, row to column (all_to_all and send/recv)")),
      h("span", null, h("label", null, "group", groupSelect), h("label", null, " step", this.stepSelect))),
      h("p", {id: "traffic-note", class: "note"}),
      h("div", {class: "traffic-body"},
        h("div", null, h("div", {id: "traffic-matrix-wrap"}), h("div", {id: "traffic-legend", class: "legend"}),
          h("p", {id: "traffic-hover", class: "muted", "aria-live": "polite"}, "Point at a cell for its figures.")),
        h("div", null, h("h3", null, "all_to_all imbalance per step"), h("div", {id: "imbalance-wrap"}))));
    this.draw();
  }

  /** The group's embedded steps, and the rows of one as {src, dst, calls, bytes}. */
  rowsAt(gi, si) {
    const flat = arr(arr(this.cells[gi])[si]);
    const rows = [];
    for (let k = 0; k + 3 < flat.length; k += 4) rows.push({src: flat[k], dst: flat[k + 1], calls: flat[k + 2], bytes: flat[k + 3]});
    return rows;
  }

  draw() {
    const g = this.groups[this.group];
    const steps = arr(g.steps);
    const imb = arr(this.imbalance[str(g.group)]);
    if (this.step == null || !steps.includes(this.step)) {  // the group's worst step shown first
      const worst = imb.find((r) => steps.includes(r[0]));
      this.step = worst ? worst[0] : steps[0];
    }
    this.stepSelect.replaceChildren(...steps.map((s) => h("option", {value: s, selected: s === this.step}, str(s))));
    const notes = [];
    const total = optNum(g.steps_total);
    if (total != null && total > steps.length) {
      notes.push(`${fmtCount(total - steps.length)} of its ${fmtCount(total)} steps are not in the page (at most ` +
        `${fmtCount(this.limits.cells)} pairs are embedded; the least uneven steps were left out): ` +
        "commdebug summary --by peer --json has them all.");
    }
    if (g.top_pairs != null) {
      notes.push(`${counted(arr(g.members).length, "member")}, over the ${fmtCount(this.limits.members)} whose whole matrix ` +
        `the page embeds: each step's ${fmtCount(g.top_pairs)} heaviest pairs only, as a list.`);
    }
    if (this.imbalanceTotal != null && this.imbalanceTotal > optNum(this.limits.imbalance)) {
      notes.push(`The imbalance lists the worst ${fmtCount(this.limits.imbalance)} of ${fmtCount(this.imbalanceTotal)} (step, group) rows.`);
    }
    $("traffic-note").textContent = notes.join(" ");
    const rows = this.rowsAt(this.group, steps.indexOf(this.step));
    $("traffic-matrix-wrap").replaceChildren(g.top_pairs != null ? this.pairTable(rows) : this.matrix(arr(g.members), rows));
    $("imbalance-wrap").replaceChildren(this.imbalanceTable(imb, steps));
  }

  /** Cell attributes shared by the matrix and the pair list: what a test or script reads. */
  static cellData(r) {
    return {"data-src": r.src, "data-dst": r.dst, "data-bytes": r.bytes, "data-calls": r.calls,
      title: `rank ${r.src} → rank ${r.dst}: ${fmtBytes(r.bytes)} in ${counted(r.calls, "call")}`};
  }

  matrix(members, rows) {
    const at = new Map(members.map((m, i) => [m, i]));
    const n = members.length;
    const grid = Array.from({length: n}, () => new Array(n).fill(null));
    let hi = 0;
    for (const r of rows) {
      if (!at.has(r.src) || !at.has(r.dst)) continue;
      grid[at.get(r.src)][at.get(r.dst)] = r;
      hi = Math.max(hi, r.bytes);
    }
    const level = (v) => (hi > 0 ? Math.min(HEAT_LEVELS - 1, Math.floor((v / hi) * HEAT_LEVELS)) : 0);
    const el = h("div", {id: "traffic-matrix", "data-testid": "traffic-matrix", class: "heatmap matrix", role: "grid",
      "aria-label": "bytes sent, sender by receiver", "data-step": this.step});
    el.style.setProperty("--cols", String(n));
    el.style.setProperty("--row-h", `${Math.max(6, Math.min(18, Math.floor(HEAT_HEIGHT / Math.max(n, 1))))}px`);
    const labelEvery = Math.ceil(n / 32);
    el.append(h("div", {class: "corner"}, "src \\ dst"));
    members.forEach((m, j) => el.append(h("div", {class: "col-label"}, j % labelEvery ? "" : str(m))));
    members.forEach((m, i) => {
      el.append(h("div", {class: "row-label"}, i % labelEvery ? "" : str(m)));
      for (let j = 0; j < n; j++) {
        const r = grid[i][j];
        el.append(r ? h("div", {class: `cell h${level(r.bytes)}`, ...TrafficPanel.cellData(r)}) : h("div", {class: "cell none"}));
      }
    });
    el.addEventListener("mouseover", (ev) => {
      const cell = ev.target.closest("[data-src]");
      if (cell) $("traffic-hover").textContent = `step ${this.step}: ${cell.title}`;
    });
    $("traffic-legend").replaceChildren(h("span", {class: "muted"}, "0"),
      ...Array.from({length: HEAT_LEVELS}, (_, k) => h("span", {class: `swatch h${k}`})), h("span", {class: "muted"}, fmtBytes(hi)),
      h("span", {class: "swatch none"}), h("span", {class: "muted"}, "no traffic"));
    return el;
  }

  pairTable(rows) {
    $("traffic-legend").replaceChildren();
    return h("table", {id: "traffic-matrix", "data-testid": "traffic-matrix", class: "grid compact", "data-step": this.step},
      h("thead", null, h("tr", null, ...["src", "dst", "calls", "bytes"].map((t) => h("th", {class: "num"}, t)))),
      h("tbody", null, ...rows.map((r) => h("tr", TrafficPanel.cellData(r), h("td", {class: "num"}, str(r.src)),
        h("td", {class: "num"}, str(r.dst)), h("td", {class: "num"}, fmtCount(r.calls)), h("td", {class: "num"}, fmtBytes(r.bytes))))));
  }

  imbalanceTable(imb, steps) {
    if (imb.length === 0) return h("p", {class: "muted"}, "No all_to_all on this group.");
    const byStep = [...imb].sort((a, b) => a[0] - b[0]);
    return h("table", {id: "imbalance-per-step", "data-testid": "imbalance-per-step", class: "grid compact"},
      h("thead", null, h("tr", null, h("th", {class: "num"}, "step"), h("th", {class: "num", title: "received bytes, max over mean"}, "max / mean"),
        h("th", {class: "num"}, "rank"), h("th", {class: "num"}, "received"))),
      h("tbody", null, ...byStep.map(([step, factor, rank, bytes]) => {
        const shown = steps.includes(step);
        const tr = h("tr", {"data-step": step, "data-factor": factor ?? "", "data-rank": rank,
          class: (step === this.step ? "selected" : "") + (shown ? "" : " absent"), title: shown ? "show this step's matrix" : "not in the page"},
        h("td", {class: "num"}, str(step)), h("td", {class: "num"}, factor == null ? "—" : factor.toFixed(2)),
        h("td", {class: "num"}, str(rank)), h("td", {class: "num"}, fmtBytes(bytes)));
        if (shown) tr.addEventListener("click", () => { this.step = step; this.draw(); });
        return tr;
      })));
  }
}
