/* The module tree: one row per module with its numbers, drawn lazily and driven by mouse and keys. */

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
    const bytesTitle = node.bytes ? PHASES.map((p) => `${p} ${fmtKnownBytes(node.bytes[p], node.unknown ? node.unknown[p] : 0)}`).join(", ")
      : node.totalBytes != null ? "bytes, all phases" : "bytes not recorded";
    const flags = this.model.flags && this.model.flags.get(node);
    const nameCell = h("span", {class: "name-cell"},
      h("span", {class: "caret", "aria-hidden": "true"}),
      h("span", {class: "name", title: node.fqn}, node.label),
      h("span", {class: "type", title: str(node.raw.module_type) || null}, shortType(node.raw.module_type)),
      flags ? h("span", {class: "flag", "data-findings": flags.length,
        title: flags.map((f) => `${str(f.kind)}: ${str(f.text ?? f.message)}`).join("\n")}, `⚠ ${flags.length}`) : null);
    nameCell.style.setProperty("--depth", String(node.depth));
    const flagged = this.model.flagged && this.model.flagged.has(node);
    const row = h("div", {class: "row cols" + (this.filter && this.filter.matches.has(node) ? " match" : "") +
      (flags ? " flagged" : flagged ? " has-flagged" : "")},
      nameCell, ...PHASES.map(cell),
      h("span", {class: "num bytes", "data-bytes": node.totalBytes ?? "", title: bytesTitle},
        fmtKnownBytes(node.totalBytes, node.totalUnknown)),
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
