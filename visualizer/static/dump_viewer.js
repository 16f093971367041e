/* The page for one dump: its summary, tree, a module's detail and op rows, and its events. */

/** An all_to_all's bytes per member, in group order, each named by its global rank when the
 * group's ranks are known: "r0 3.69 KiB, r1 4.31 KiB". */
function splitsText(splits, ranks) {
  if (!Array.isArray(splits)) return "—";
  return h("code", {class: "splits", "data-bytes": splits.join(",")}, splits.map((b, i) => `${ranks && ranks[i] != null ? `r${str(ranks[i])}` : `#${i}`} ${fmtBytes(b)}`).join(", "));
}

/** Steps as one short line: "0, 10, 20", or "0, 100, 200, …, 9900 (100 steps)". */
function stepList(steps) {
  return steps.length <= 6 ? steps.join(", ")
    : `${steps.slice(0, 3).join(", ")}, …, ${steps[steps.length - 1]} (${steps.length} steps)`;
}

/**
 * A light capture (docs/capture.md) as a fact and a note, from a dump's metadata; null for a
 * full capture, whose page stays as it was. Light steps have no DTensor ops or op rows, so the
 * reader must know which steps do before trusting an empty op table.
 */
function lightCapture(meta) {
  if (!isObj(meta) || meta.capture !== "light") return null;
  const steps = arr(meta.detail_steps).filter((s) => Number.isInteger(s)).sort((a, b) => a - b);
  const every = Number.isInteger(meta.detail_every) ? ` (detail_every=${meta.detail_every})` : "";
  const value = steps.length ? `light capture; detail on steps ${stepList(steps)}` : "light capture; no detail steps";
  return {
    fact: fact("meta-capture", "capture", value),
    note: steps.length
      ? `Light capture: DTensor ops and operation rows were recorded only on steps ${stepList(steps)}${every}; every collective on every step.`
      : `Light capture: every collective, but no DTensor ops or operation rows${every}.`,
  };
}

/** The page for one loaded dump. */
class Viewer extends BaseViewer {
  constructor(dump, predicted) {
    super();
    const model = this.model = buildModel(dump, predicted);
    showMode(false);
    showPredicted(model.pred);
    this.noise = model.noiseLevel ?? 3;
    this.renderSummary();
    this.showTree(`share of all ${model.shareUnit} (Global = 100%)`);
    this.renderEvents();
    for (const radio of document.querySelectorAll('input[name="noise"]')) {
      radio.checked = Number(radio.value) === this.noise;
    }
  }

  renderSummary() {
    const {model} = this, cd = model.cd;
    const meta = cd && isObj(cd.metadata) ? cd.metadata : {};
    const totals = runTotals(model);
    const show = (v) => (v == null || v === "" ? "—" : str(v));
    const facts = model.reference
      ? [fact("format", "format", "reference CommDebugMode dump")]
      : [
        fact("meta-rank", "rank", show(meta.rank)),
        fact("meta-world-size", "world size", show(meta.world_size)),
        fact("meta-host", "host", show(meta.hostname)),
        fact("meta-backend", "backend", show(meta.backend)),
        fact("meta-torch", "torch", show(meta.torch_version)),
        // a torch.profiler trace: its ProfilerStep numbers need not start at 0 (steps 1009-1014 are 6)
        fact("meta-steps", "steps", Array.isArray(meta.profile_steps) && meta.profile_steps.length === 2
          ? `${fmtCount(num(meta.profile_steps[1]) - num(meta.profile_steps[0]) + 1)} (${str(meta.profile_steps[0])}–${str(meta.profile_steps[1])})`
          : show(meta.steps)),
        fact("meta-noise", "noise level", show(cd.noise_level)),
      ];
    const light = model.reference ? null : lightCapture(meta);
    if (light) facts.push(light.fact);
    facts.push(
      fact("total-collectives", "collectives", fmtCount(totals.count)),
      fact("total-bytes", "bytes", totals.bytes == null && !totals.unknown ? "not recorded" : fmtKnownBytes(totals.bytes, totals.unknown)));
    const {pred} = model;
    if (pred) {
      facts.push(fact("total-pred", `predicted on ${pred.cluster}`, predCell(pred, pred.total)));
    }
    const byOp = h("ul", {id: "by-op", class: "chips", "aria-label": "collectives by op"},
      ...totals.byOp.sort((a, b) => (b.bytes ?? b.count) - (a.bytes ?? a.count)).map((e) =>
        h("li", {"data-op": e.op, "data-count": e.count, "data-bytes": e.bytes ?? ""},
          opTag(e.op), h("span", {class: "count"}, `×${fmtCount(e.count)}`),
          e.bytes == null && !e.unknown ? null : h("span", {class: "muted"}, fmtKnownBytes(e.bytes, e.unknown)))));
    const notes = [];
    if (model.reference) {
      notes.push("Written by PyTorch's CommDebugMode: no bytes, groups or events; " +
        "backward counts include activation-checkpoint recompute.");
    }
    if (light) notes.push(light.note);
    // torch.compile'd code: where its collectives are attributed (metadata.compile_notes)
    if (cd && isObj(cd.metadata)) notes.push(...arr(cd.metadata.compile_notes).map(str));
    if (cd && num(cd.events_dropped) > 0) {
      notes.push(`${fmtCount(num(cd.events_dropped))} events were dropped ` +
        `(max_events ${fmtCount(optNum(cd.max_events))}); counts and bytes still cover them.`);
    }
    if (pred) {
      notes.push(`"pred" figures are predicted on ${pred.cluster} from the bytes and groups recorded ` +
        "(a model, not a measurement; calls added up as if serial).", ...pred.notes.map((n) => `prediction: ${n}`));
    }
    showSummary(facts, notes, byOp);
  }

  resetFilters() {
    super.resetFilters();
    const ops = [...opTotals(this.model.root).keys()].sort();
    $("op-filter").replaceChildren(h("option", {value: ""}, "any collective"),
      ...ops.map((op) => h("option", {value: op}, `issues ${op}`)));
    $("op-filter").title = "";
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
        h("td", {class: "num"}, node.bytes ? fmtKnownBytes(node.bytes[p], node.unknown ? node.unknown[p] : 0) : "—"),
        pred ? h("td", {class: "num"}, predCell(pred, predOf(pred, node, p))) : null)))));
    const lines = pred && isObj(pred.lines[node.fqn]) ? pred.lines[node.fqn] : {};
    const collectiveColumns = [
      {key: "phase", label: "phase", value: (c) => c.phase, cell: (c) => phaseTag(c.phase)},
      {key: "op", label: "op", value: (c) => c.op, cell: (c) => opTag(c.op)},
      {key: "count", label: "calls", value: (c) => c.count, cell: (c) => fmtCount(c.count), cls: "num"},
      {key: "bytes", label: "bytes", value: (c) => c.bytes, cell: (c) => fmtKnownBytes(c.bytes, c.unknown), cls: "num"},
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
      ...detailHead(node),
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
      }}, str(e.module)) : e.module === "?" ? "unknown" : str(e.module);  // a trace names no module
    };
    const columns = [
      {key: "index", label: "#", value: (e) => optNum(e.index), cls: "num"},
      {key: "step", label: "step", value: (e) => optNum(e.step), cls: "num"},
      {key: "phase", label: "phase", value: (e) => e.phase, cell: (e) => phaseTag(str(e.phase))},
      {key: "op", label: "op", value: (e) => e.op, cell: (e) => opTag(str(e.op))},
      {key: "bytes", label: "bytes", value: (e) => optNum(e.size_bytes), cell: (e) => fmtSize(e.size_bytes), cls: "num"},
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
    const compiled = events.filter((e) => e.compiled === true).length;
    if (compiled) {  // torch.compile'd code issued these (docs/compile.md)
      columns.push({key: "compiled", label: "compiled", value: (e) => (e.compiled === true ? "compiled" : ""),
        cell: (e) => (e.compiled === true ? compiledTag() : "")});
    }
    const inFlight = events.filter((e) => e.in_flight).length;
    const failed = events.filter((e) => e.error != null).length;
    if (inFlight || failed) {
      const state = (e) => (e.error != null ? "failed" : e.in_flight ? "in flight" : null);
      columns.push({key: "state", label: "state", value: state,
        cell: (e) => h("span", null, e.in_flight ? inFlightTag() : "", e.error != null ? failedTag(e.error) : "")});
    }
    $("events-count").textContent = `${fmtCount(events.length)} recorded` +
      (compiled ? `, ${fmtCount(compiled)} from compiled code` : "") +
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
      ["compiled", e.compiled === true ? compiledTag() : "no"],
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
      ["input bytes", fmtSize(e.input_bytes)],
      ["output bytes", fmtSize(e.output_bytes)],
      ["message size", fmtSize(e.size_bytes)],
      ...(e.send_splits || e.recv_splits ? [["sent to each member", splitsText(e.send_splits, ranks)],
        ["received from each member", splitsText(e.recv_splits, ranks)]] : []),
      ["DTensor op", h("code", null, str(e.dtensor_op) || "—")],
      ["placements", h("code", null, str(e.placements) || "—")],
      ["mesh", h("code", null, str(e.mesh) || "—")],
      ["source", h("code", null, str(e.source) || "—")],
      ["start", e.start_s == null ? "—" : `${fmtOffset(e.start_s)} after the start`],
      ["latency", timed ? fmtSeconds(e.latency_s) : "not timed"],
      ...(this.model.pred && this.model.pred.events ? [["predicted", e.predicted_s == null ? "not predicted"
        : h("span", null, predCell(this.model.pred, e.predicted_s), ` on ${this.model.pred.cluster} (a model, not a measurement)`)]] : []),
      // timed, but its size (or its group's size, for busbw) not known: "?", never a figure
      ["bandwidth", !timed ? "—" : algbw == null ? "algbw ?, busbw ? (size not known)" :
        `algbw ${algbw.toFixed(2)} GB/s, busbw ${optNum(e.busbw_factor) == null ? "? (group size not known)"
          : `${(algbw * e.busbw_factor).toFixed(2)} GB/s`}`],
    ];
    const box = $("event-detail");
    box.replaceChildren(h("h3", null, `Call #${str(e.index)}`),
      h("div", {class: "table-wrap"}, h("table", {id: "event-fields", class: "grid compact kv"},
        h("tbody", null, ...rows.map(([k, v]) => h("tr", {"data-field": k}, h("th", {scope: "row"}, k), h("td", null, v)))))));
    box.hidden = false;
    box.classList.toggle("in-flight", e.in_flight);
  }
}
