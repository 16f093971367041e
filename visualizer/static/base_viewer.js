/* What the one-dump page (dump_viewer.js) and the folder page (ranks_viewer.js) share: which
 * parts of the page show, the summary's layout, the detail's heading, and a base class that
 * owns the tree and its filters.
 */

/** Show the single-dump parts of the page, or the folder page's. */
function showMode(ranks) {
  $("rank-picker").hidden = !ranks;
  $("findings").hidden = !ranks;
  if (!ranks) {  // a dump opened on the folder page: the folder's sections go
    for (const id of ["heatmap-section", "overlap-section", "traffic-section"]) $(id).hidden = true;
  }
  $("op-filter").hidden = ranks;
  $("ops-section").hidden = ranks;
  if (ranks) $("events").hidden = true;
}

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

/** One figure of the summary, its value findable by `id`. */
const fact = (id, label, value) =>
  h("div", {class: "fact"}, h("span", {class: "label"}, label), h("span", {id, class: "value"}, value));

/** Fill the summary: the facts, then the `middle` nodes, then the notes. */
function showSummary(facts, notes, ...middle) {
  $("summary").replaceChildren(h("div", {class: "facts"}, ...facts), ...middle,
    ...notes.map((n) => h("p", {class: "note"}, n)));
}

/** The detail's heading: the module's name and type (Global has none: it is the whole run). */
const detailHead = (node) => [
  h("h2", {id: "detail-fqn"}, node.fqn),
  h("p", {id: "detail-type", class: "muted"}, str(node.raw.module_type) ||
    (node.parent ? "module type not recorded" : "pseudo-module: the whole run")),
];

/**
 * The page for what is loaded; the static controls (main.js) call into the current one. A
 * subclass sets `model` (see buildModel) before showTree and draws a module's detail in
 * renderDetail(node).
 */
class BaseViewer {
  /** Draw the tree with Global selected; `shareTitle` says what its share bars compare. */
  showTree(shareTitle) {
    this.tree = new TreeView(this.model, $("tree"), (node) => this.renderDetail(node));
    this.resetFilters();
    this.tree.render();
    this.tree.select(this.model.root);
    $("share-head").title = shareTitle;
  }

  resetFilters() {
    $("search").value = "";
    $("op-filter").value = "";
    $("match-count").textContent = "";
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
    $("match-count").textContent = counted(matches.size, "match", "es");
    this.tree.setFilter({matches, visible});
  }

  /** Only a dump has op rows for the noise level to choose from. */
  setNoise() {}

  /** Select `node` in the tree, clearing a filter that hides it. */
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
