/* Start-up: wires the page's static controls to the current viewer, and shows the embedded dump,
 * the embedded folder of ranks, or (neither embedded) the drop zone for a dump to open.
 */

let viewer = null;

function showError(err) {
  const box = $("error");
  box.replaceChildren(h("strong", null, err instanceof DumpError ? err.message : "Could not show this dump."),
    " ", str(err instanceof DumpError ? err.detail : String(err)));
  box.hidden = false;
  document.body.dataset.state = "error";
  $("dropzone").hidden = viewer !== null;
}

/** Show the viewer `make` returns, or why it could not; false when it could not. */
function start(make) {
  let next;
  try {
    next = make();
  } catch (err) {
    if (!(err instanceof DumpError)) console.warn(err);  // a bug in us or a very odd file
    showError(err);
    return false;  // the viewer shown before, if any, stays current
  }
  viewer = next;
  $("error").hidden = true;
  $("dropzone").hidden = true;
  $("viewer").hidden = false;
  document.body.dataset.state = "ready";
  return true;
}

function load(text, source, predicted = null) {
  return start(() => {
    const dump = parseDump(text);
    performance.mark("commdebug:parsed");
    const next = new Viewer(dump, predicted);
    $("source").textContent = source ? `— ${source}` : "";
    return next;
  });
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

/** The folder page (visualizer.write_ranks_html). */
function loadRanks(text) {
  return start(() => {
    const index = parseRanks(text);
    performance.mark("commdebug:parsed");
    return new RanksViewer(index);
  });
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
