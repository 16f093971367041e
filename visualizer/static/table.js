/* Tables and the small elements their cells show. */

const PAGE_ROWS = 200;

/**
 * A table showing PAGE_ROWS rows at a time with a "show more" button; event lists reach
 * 100k rows. columns: {key, label, value(row), cell?(row) -> text|Node, cls?}. With
 * `sortable`, clicking a header sorts by value (nulls last), clicking again reverses. The
 * returned element's `reveal(test)` shows rows up to the first one `test` accepts and returns
 * its <tr> (null if none does).
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

  function reveal(test) {
    const i = sorted.findIndex(test);
    if (i < 0) return null;
    while (shown <= i) fill();
    return tbody.children[i] || null;
  }

  fill();
  const wrap = h("div", {class: "table-wrap"}, table, more);
  wrap.reveal = reveal;
  return wrap;
}

// One line per DTensor argument, so shapes and placements line up across columns.
const lines = (items) => h("span", {class: "lines"}, ...items.map((t) => h("code", null, t)));
const phaseTag = (phase) => h("span", {class: "phase " + (PHASE_SHORT[phase] || "")}, phase);
const opTag = (op) => h("span", {class: "op", "data-op": op}, op);
const inFlightTag = () => h("span", {class: "badge in-flight", title: "not finished when the dump was written"}, "in flight");
const failedTag = (error) => h("span", {class: "badge failed", title: str(error)}, "failed");
const compiledTag = () => h("span", {class: "badge compiled", title: "issued by torch.compile'd code"}, "compiled");

const predTitle = (pred) => `predicted on ${pred.cluster}: a model, not a measurement`;
/** A predicted time, marked as one (class "pred", and the title says so). */
const predCell = (pred, seconds) => h("span", {class: "pred", title: predTitle(pred),
  "data-pred": optNum(seconds) ?? ""}, fmtSeconds(optNum(seconds)));
